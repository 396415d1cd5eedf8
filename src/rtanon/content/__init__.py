"""The causal content encoder at run time: its projections ``z`` at 50 Hz, distilled from Whisper.

- ``stream``: ``ContentEncoderModel`` (shared ONNX Runtime session over the shipped graph or another one)
  and ``ContentEncoderStage`` (per-session stream, the stage contract). Needs only numpy and onnxruntime.
  ``TorchContentEncoder``: the same runner on PyTorch (a CUDA server's content step, batched, replayed
  as CUDA graphs), from the torch weights shipped beside the graph.
- ``config``, ``model``: the torch network and its sizes (torch only where ``model`` is imported).

Its teacher, training, evaluation and export live in :mod:`rtanon.train`; see
``models/content/MODEL_CARD.md``. Nothing heavy is imported here.
"""
