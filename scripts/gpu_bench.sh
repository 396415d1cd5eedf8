#!/usr/bin/env bash
# GPU figures of the neural method, on a machine with an NVIDIA GPU and a CUDA build of PyTorch
# (rtanon set up as in the README, plus torch):
#
#   scripts/gpu_bench.sh [OUT_DIR]      (default OUT_DIR: gpu-bench)
#
# 1. the vocoder tests, CUDA ones included (CUDA graphs against the CPU; TensorRT when importable);
# 2. `rtanon bench --method neural` with the torch backend on CUDA, CUDA graphs on, then off, each with
#    batched sessions up to 4096 (how many real-time streams one GPU sustains);
# 3. the same with ONNX Runtime on this machine's CPU (1 thread), the in-run reference;
# 4. `rtanon serve`'s tick alone (`bench --serve --no-network --ramp`), content encoder and vocoder on CUDA
#    (torch, CUDA graphs per batch bucket), F0 on the CPU's C++ kernel: the largest N of sessions whose
#    tick p99 stays within 15 ms (issue 43's GPU target), then the same on the CPU (ONNX Runtime) as the
#    in-run reference.
# Each bench's last line is its JSON; everything is also written to OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bench}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to PyTorch')"
"$py" -c "import torch; print(torch.cuda.get_device_name(0), 'torch', torch.__version__, 'CUDA', torch.version.cuda)" \
  | tee "$out/device.txt"
"$py" -m pytest -q -rs -p no:cacheprovider tests/test_neural_vocoder.py tests/test_content_encoder.py 2>&1 \
  | tee "$out/tests_vocoder.txt"
bench=(-m rtanon bench --method neural --seconds 20)
"$py" "${bench[@]}" --backend torch --accelerator cuda --streams 4096 --json 2>&1 | tee "$out/bench_torch_cuda.txt"
"$py" "${bench[@]}" --backend torch --accelerator cuda --no-cuda-graphs --streams 4096 --json 2>&1 \
  | tee "$out/bench_torch_cuda_no_graphs.txt"
"$py" "${bench[@]}" --backend onnxruntime --streams 64 --json 2>&1 | tee "$out/bench_onnxruntime_cpu.txt"
ticks=(-m rtanon bench --serve --no-network --method neural --ramp --serve-seconds 10 --json)
"$py" "${ticks[@]}" --backend torch --accelerator cuda --sessions 2048 2>&1 | tee "$out/serve_ticks_cuda.txt"
"$py" "${ticks[@]}" --sessions 64 2>&1 | tee "$out/serve_ticks_cpu.txt"
