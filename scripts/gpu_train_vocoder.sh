#!/usr/bin/env bash
# The vocoder's GPU fine-tune (issue 24 item 6), on a machine with an NVIDIA GPU and PyTorch but not
# necessarily rtanon's set-up (the lent machines here have torch, numpy, onnxruntime and tqdm):
#
#   scripts/gpu_train_vocoder.sh PACK OUT_DIR MINUTES [INIT]
#
# PACK is `rtanon lab shards pack SHARDS PACK` made where the shards are (43 MB for the 2.9 h of
# so762_train + libri_clips); INIT defaults to the balanced generator. It unpacks the shards with the
# content encoder's torch weights (z from the decoded audio, on CUDA), then runs the balanced recipe's
# last stage with the MPD/MSD losses (on CUDA they join at step 0) for MINUTES, and leaves
# OUT_DIR/generator.pt, train.log and vocoder.onnx; `rtanon lab package-vocoder OUT_DIR/generator.pt DIR`
# packages it where rtanon is set up. A machine without soundfile needs its wheels (soundfile, cffi,
# pycparser) in .whl/; a machine that takes at most 64 MiB of working tree needs the weights this does
# not read (the vocoder graphs, the strong generator, the content graph) left out of the copy.
# First run, 2026-11-26, one H200: unpack 23 s, 0.17 s per step (lab notes, neural-vocoder.md).
set -euo pipefail
cd "$(dirname "$0")/.."
pack=$1 out=$2 minutes=$3 init=${4:-src/rtanon/models/neural/balanced/generator.pt}
py=${PYTHON:-python3}
if ! "$py" -c "import soundfile" 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/rtanon-site .whl/*.whl
  export PYTHONPATH=/tmp/rtanon-site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src PYTHONUNBUFFERED=1
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to PyTorch')"
weights=models/content/content_encoder.pt
"$py" -m rtanon lab shards unpack "$pack" "$out/shards" --content-weights $weights --jobs 16
"$py" -m rtanon train vocoder --shards "$out/shards" --out "$out" --init "$init" --residual-start-step 0 \
  --checkpoint-every 500 --content-loss 30 --content-weights $weights --input-mel 40 --input-cepstra 16 \
  --steps 200000 --max-minutes "$minutes"
