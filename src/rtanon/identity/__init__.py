"""Pseudo-speaker identities.

- :mod:`.encoder`: speaker encoder interface, resemblyzer d-vectors, ``embed_first_speech``.
- :mod:`.pitch`: F0 tracking behind one function, quantile helpers (paper 000 Eq. 6).
- :mod:`.pool`: ``SpeakerPool`` (shipped as ``rtanon/models/speaker_pool.npz``), ``build_pool``.
- :mod:`.plda`: two-covariance PLDA, the one PLDA (the ``plda`` distance here, the semi-informed attacker in ``rtanon.eval``).
- :mod:`.select`: paper 000 selection (distance, proximity, gender) -> ``Selector``.
- :mod:`.generate`: paper 003 PCA + GMM generation with a joint pitch model; KS and entropy.
- :mod:`.speaker`: ``PseudoSpeaker``, ``IdentityModel``, ``new_identity``, ``assign_identities``.
- :mod:`.report`: hyper-parameter search and diversity report.

Nothing heavy is imported here; import the submodule you need.
"""
