"""The causal content encoder at run time: its projections ``z`` at 50 Hz, distilled from Whisper.

- ``stream``: ``ContentEncoderModel`` (shared ONNX Runtime session over the shipped graph or another one)
  and ``ContentEncoderStage`` (per-session stream, the stage contract). Needs only numpy and onnxruntime.

The torch network, its teacher, training, evaluation and export live in :mod:`rtanon.train`; see
``models/content/MODEL_CARD.md``. Nothing heavy is imported here.
"""
