"""F0 (fundamental frequency) tracking and pitch conversion.

Map of the subpackage:

- ``rtanon.f0.config``: ``F0Config`` (settings, ``validate()``) and ``derive``
  (the constants both kernels share).
- ``rtanon.f0.tracker``: ``F0Tracker``, the streaming stage (``process``,
  ``reset``, ``hop``, ``latency_samples``), ``track(signal)`` for whole
  signals, and kernel selection (``"cpp"`` from ``rtanon._core``, ``"numba"``
  fallback).
- ``rtanon.f0.numba_kernel``: the Numba kernel (same algorithm as the C++ one); its per-frame searches
  (FFT, spectral and NCCF candidates) in ``rtanon.f0.numba_candidates``.
- ``rtanon.f0.convert``: pitch conversion to a pseudo-speaker (percentile,
  log-Gaussian, min-max; paper 000 Eq. 4-7), the online quantile estimator and
  the per-session streaming converter.

Frame timing: frame k is centred at ``k * 10 ms`` (sample ``160 * k`` at
16 kHz); values are in Hz, 0 for unvoiced frames.
"""
