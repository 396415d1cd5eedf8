#!/usr/bin/env bash
# The vocoder's GPU fine-tune (issue 24 item 6), on a machine with an NVIDIA GPU and PyTorch but not
# necessarily rtanon's set-up (the lent machines here have torch, numpy, onnxruntime and tqdm):
#
#   scripts/gpu_train_vocoder.sh PACK OUT_DIR MINUTES [TRAIN_OPTION ...]
#
# PACK is `rtanon lab shards pack SHARDS PACK` made where the shards are (43 MB for the 2.9 h of
# so762_train + libri_clips), or shards already unpacked from one (several runs can share them). It unpacks
# the shards with the content encoder's torch weights (z from the decoded audio, on CUDA) into OUT_DIR/shards,
# then fine-tunes with the strong point's recipe (models/neural/MODEL_CARD.md, recipe step 2: from the strong
# generator, with the content loss; on CUDA the MPD/MSD losses join at step 0 unless --no-gan) for MINUTES,
# and leaves OUT_DIR/generator.pt, train.log and vocoder.onnx; `rtanon lab package-vocoder OUT_DIR/generator.pt
# DIR` packages it where rtanon is set up. CONTENT_WEIGHTS names another content encoder's torch weights
# (`rtanon lab export-content ... --weights FILE`; default the shipped one): its z is computed at unpacking
# and read by the content loss. TRAIN_OPTIONs go to `rtanon train vocoder` after the recipe's and win over
# them (e.g. --init FILE). A machine without soundfile needs its wheels (soundfile, cffi, pycparser) in
# .whl/ (for the lent machines' Python 3.12: pip download --no-deps --only-binary=:all: --python-version
# 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl soundfile==0.14.0 cffi
# pycparser); a machine that takes at most 64 MiB of working tree needs the weights this does not read (the
# vocoder graphs, the balanced and utterance generators, the content graphs) left out of the copy.
# First run, 2026-11-26, one H200: unpack 23 s, 0.17 s per step; eighteenth session, one H100: unpack about
# 20 s, several runs side by side on the card (lab notes, neural-vocoder.md).
set -euo pipefail
cd "$(dirname "$0")/.."
pack=$1 out=$2 minutes=$3
shift 3
py=${PYTHON:-python3}
if ! "$py" -c "import soundfile" 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/rtanon-site .whl/*.whl
  export PYTHONPATH=/tmp/rtanon-site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src PYTHONUNBUFFERED=1
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to PyTorch')"
weights=${CONTENT_WEIGHTS:-src/rtanon/models/content/content_encoder.pt}
shards=$pack
if ! grep -q '"rtanon-vocoder-shards' "$pack/manifest.json"; then
  shards=$out/shards
  "$py" -m rtanon lab shards unpack "$pack" "$shards" --content-weights $weights --jobs 16
fi
"$py" -m rtanon train vocoder --shards "$shards" --out "$out" --init src/rtanon/models/neural/generator.pt \
  --residual-start-step 0 --checkpoint-every 500 --content-loss 30 --content-weights $weights \
  --steps 200000 --max-minutes "$minutes" "$@"
