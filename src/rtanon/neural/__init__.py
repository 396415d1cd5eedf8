"""The neural method's vocoder at run time (ONNX Runtime; torch only for its torch backend).

- :mod:`rtanon.neural.config`: ``VocoderConfig``, the vocoder's shape; its defaults are the shipped model's.
- :mod:`rtanon.neural.vocoder`: ``HarmonicNoiseVocoder`` (harmonic-plus-noise synthesis from predicted
  spectral envelopes, refined by a causal HiFi-GAN upsampling stack; explicit streaming state) and
  ``load_generator`` for ``generator.pt`` checkpoints.
- :mod:`rtanon.neural.input_mel`: log-mel spectra of the input audio in numpy (the content encoder's mel
  filterbank, one log-mel frame per 20 ms frame); no vocoder reads the input spectrum since 2026-12-03.
- :mod:`rtanon.neural.backends`: one streaming-step interface (``VocoderBackend``) with a factory
  ``make_backend("onnxruntime" | "torch" | "tensorrt", ...)`` and ``VocoderStream``, the per-session
  object that hides the state tuple.

The shipped weights are package data: ``rtanon/models/neural/`` (the ``strong`` privacy point) and
``rtanon/models/neural/balanced/`` (on the streaming Whisper content); see ``models/neural/MODEL_CARD.md``.
Training, losses, discriminators and feature shards live in :mod:`rtanon.train`.
"""
