"""Causal content encoder: soft speech units at 50 Hz, distilled from Whisper.

Map of the subpackage:

- ``model``: the torch network (``ContentEncoder``) with its log-mel front end
  inside the graph and every recurrent/convolution state passed in and out
  explicitly (``init_state()`` / ``forward(audio, *state)``), and
  ``ContentModelConfig``.
- ``features``: teacher side (Whisper tiny.en via CTranslate2, k-means units)
  and the on-disk cache used by training. Needs the ``[train]`` extra.
- ``train``: the training recipe behind ``rtanon train content``.
- ``export``: torch checkpoint to ONNX with explicit state inputs/outputs.
- ``stream``: ``ContentEncoderModel`` (shared ONNX session) and
  ``ContentEncoderStage`` (per-session stream, the stage contract). Needs only
  numpy and onnxruntime.
- ``bench``: per-chunk compute time of the ONNX streaming encoder
  (``python -m rtanon.content.bench``).
- ``evaluate``: teacher agreement and speaker-information figures on a
  held-out Kaldi directory.

Nothing heavy is imported here.
"""
