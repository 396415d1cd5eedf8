#!/usr/bin/env bash
# Developer build: compiles rtanon._core into src/rtanon/ so that
# `PYTHONPATH=src python -m rtanon ...` and `PYTHONPATH=src pytest` work
# without reinstalling. Users install with `pip install .` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
pybind_dir=$("$py" -m pybind11 --cmakedir)
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$pybind_dir" \
  -DPython_EXECUTABLE="$(command -v "$py")" >/dev/null
cmake --build build/dev >/dev/null
cp build/dev/_core*.so src/rtanon/
echo "built $(ls src/rtanon/_core*.so)"
