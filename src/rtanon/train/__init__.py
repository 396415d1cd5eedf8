"""Everything that trains rtanon's models, and the research tools behind their cards. The run time never
imports this package (``tests/test_layout.py`` checks it); it needs the ``[train]`` extra.

Vocoder (``rtanon train vocoder``):

- ``shards``: feature shards from Kaldi-style directories (content ``z``, F0, speaker embeddings) and the
  dataset over them;
- ``vocoder_config``: ``TrainConfig`` (the shipped recipe as defaults) and ``DiscriminatorConfig``;
- ``vocoder``: the resumable training loop, embedding blending, the content-consistency loss, warm starts;
- ``losses``, ``discriminators``: HiFi-GAN's mel, multi-resolution STFT, adversarial and feature-matching
  losses, and its multi-period and multi-scale discriminators.

Content encoder (``rtanon train content``):

- ``teacher``: the Whisper tiny.en teacher's features and k-means units, cached per corpus;
- ``content``: the distillation recipe;
- ``whisper``: Whisper's encoder in torch from the shipped CTranslate2 weights and its streaming form
  (``lab export-whisper``); ``whisper_tune``: the recipe that fine-tunes it (``train content --whisper``).

Both, and research tools (``rtanon lab TOOL``):

- ``export``: torch checkpoints to the ONNX graphs the run time loads (``lab export-content``);
- ``content_eval``: the content encoder's held-out figures (``lab content-eval``);
- ``wer_paired``: paired per-utterance WER between systems (``lab wer-paired``);
- ``budget``: the intelligibility budget, stage by stage, on both evaluation sets (``lab budget``);
  ``envelope_probe``: envelopes regressed from teacher, phone or student content (``lab envelope-probe``);
- ``probes``: where intelligibility is lost (``lab probe``); ``spectrogram``: the cards' figure
  (``lab spectrogram-pair``); ``bench_vocoder``: architecture timing (``lab bench-vocoder``);
- ``commands``: the ``train`` and ``lab`` subcommands.
"""
