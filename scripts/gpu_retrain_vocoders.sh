#!/usr/bin/env bash
# Both shipped vocoders fine-tuned on a new content encoder's z, side by side on one GPU (what a new
# content encoder needs before it ships: models/content/MODEL_CARD.md, recipe):
#
#   CONTENT_WEIGHTS=ENC.pt scripts/gpu_retrain_vocoders.sh PACK OUT_DIR MINUTES [TRAIN_OPTION ...]
#
# PACK: `rtanon lab shards pack SHARDS PACK --content-onnx ENC.onnx` made where rtanon is set up (the shards
# of `rtanon train vocoder --content-onnx ENC.onnx`). The shards are unpacked once with ENC.pt (z on CUDA),
# then two runs of scripts/gpu_train_vocoder.sh share the card for MINUTES each:
#   OUT_DIR/balanced: from the balanced generator, its last stage (--no-gan --speaker-adversary 3,
#                     content loss 60: the weight of the twenty-ninth session's candidate B);
#   OUT_DIR/strong:   from the strong generator, content from z alone (--input-mel 0 --input-cmn 0, content loss 30).
# Each leaves generator.pt, train.log and trainer.pt (resumable with the same command); package them
# where rtanon is set up: `rtanon lab package-vocoder OUT_DIR/balanced/generator.pt DIR` (strong: the
# generator.pt and vocoder.onnx as `rtanon train vocoder` writes them). TRAIN_OPTIONs go to both runs.
# First use (twenty-ninth session, one H200, 7 minutes): 3,700 steps each at 0.12 s per step.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=$1 out=$2 minutes=$3
shift 3
: "${CONTENT_WEIGHTS:?set CONTENT_WEIGHTS to the torch weights of the new content encoder}"
py=${PYTHON:-python3}
mkdir -p "$out"
if ! grep -q '"rtanon-vocoder-shards' "$pack/manifest.json"; then
  if ! "$py" -c "import soundfile" 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/rtanon-site .whl/*.whl
    export PYTHONPATH=/tmp/rtanon-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src "$py" -m rtanon lab shards unpack "$pack" "$out/shards" \
    --content-weights "$CONTENT_WEIGHTS" --jobs 16
  pack=$out/shards
fi
scripts/gpu_train_vocoder.sh "$pack" "$out/balanced" "$minutes" --no-gan --threads 6 --speaker-adversary 3 \
  --content-loss 60 "$@" > "$out/balanced.log" 2>&1 &
balanced=$!
scripts/gpu_train_vocoder.sh "$pack" "$out/strong" "$minutes" --no-gan --threads 6 --input-mel 0 --input-cmn 0 \
  --init src/rtanon/models/neural/generator.pt "$@" > "$out/strong.log" 2>&1 &
strong=$!
status=0
wait $balanced || status=$?
wait $strong || status=$?
tail -n 3 "$out/balanced.log" "$out/strong.log"
exit $status
