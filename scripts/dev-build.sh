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
# replace atomically: a running process that has the old module mapped keeps its copy
for so in build/dev/_core*.so; do
  name=$(basename "$so")
  cp "$so" "src/rtanon/.$name.tmp" && mv -f "src/rtanon/.$name.tmp" "src/rtanon/$name"
done
echo "built $(ls src/rtanon/_core*.so)"
