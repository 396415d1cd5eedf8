"""Neural voice conversion: a causal HiFi-GAN vocoder (harmonic-plus-noise source), what trains and runs it.

Map of the subpackage (needs the ``[neural]`` extra: torch, onnx, onnxruntime;
nothing here is imported by the engine or the CPU live path yet):

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
  them, and the resumable training loop (``python -m rtanon.neural.train``).
- :mod:`rtanon.neural.features`: ``build_shards`` from Kaldi-style
  directories with pluggable extractors (content units, F0, speaker
  embedding) and speed perturbation.
- :mod:`rtanon.neural.input_mel`: the input's log-mel per 20 ms frame, the
  vocoder's optional second content input (``VocoderConfig.input_mel_bins``),
  streaming and offline, and its training-time perturbation (numpy only).
- :mod:`rtanon.neural.rates`: the 50 Hz / 100 Hz / 16 kHz constants (no torch).
- :mod:`rtanon.neural.bench_vocoder`: ONNX Runtime CPU timing of the
  streaming step (``python -m rtanon.neural.bench_vocoder``).

Not trained yet: see ``models/neural/README.md``.
"""
