"""Neural voice conversion: a causal NSF-HiFi-GAN vocoder and what trains and runs it.

Map of the subpackage (every module imports torch lazily or only when used;
nothing here is imported by the CPU live path yet):

- :mod:`rtanon.neural.vocoder`: ``VocoderConfig`` and ``CausalNsfHifiGan``,
  the causal generator with explicit streaming state (``init_state``,
  ``forward_stream``) and its offline ``forward``; ``export_onnx``.
- :mod:`rtanon.neural.backends`: one streaming-step interface
  (``VocoderBackend``) with a factory ``make_backend("onnxruntime" | "torch" |
  "tensorrt", ...)`` and ``VocoderStream``, the per-session object that hides
  the state tuple.
- :mod:`rtanon.neural.losses`: multi-resolution STFT loss, mel L1 loss,
  adversarial and feature-matching losses (SSL-SAS paper Eq. 2-5).
- :mod:`rtanon.neural.discriminators`: HiFi-GAN multi-period and multi-scale
  discriminators.
- :mod:`rtanon.neural.train`: compact feature shards, the dataset reading
  them, and the resumable training loop.

Not trained yet: see ``models/neural/README.md``.
"""
