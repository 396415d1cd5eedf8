"""Signal comparisons used by the benchmarks and the fail-closed tests.

- ``max_xcorr(a, b)``: peak normalized cross-correlation of two waveforms
  over all lags (1.0: ``b`` contains ``a``; near 0: unrelated).
- ``windowed_max_xcorr(x, y)``: the largest ``max_xcorr`` of any audible half-second of ``y`` with ``x``
  around it (the soak's and the server's raw-voice yardstick).
- ``envelope(x)``: log-energy envelope at 1 kHz.
- ``envelope_delay_s(ref, rec)``: delay of ``rec`` behind ``ref`` from their
  envelopes, which survives anonymization (the voice changes, the timing
  of syllables does not).
"""

from __future__ import annotations

import numpy as np
from scipy.signal import correlate

from rtanon.constants import SAMPLE_RATE_HZ


#: Below this RMS (-100 dBFS, under a 16-bit step) a stretch of ``b`` is inaudible and scores 0 in
#: :func:`max_xcorr`: there the FFT's rounding error, divided by a near-zero energy, would score far above 1.
MIN_COPY_RMS = 1e-5


def max_xcorr(a: np.ndarray, b: np.ndarray) -> float:
    """max over lags of |<a, b shifted>| / (|a| |b shifted|), using the local
    energy of ``b`` under ``a`` so a quiet copy still scores 1 (down to
    :data:`MIN_COPY_RMS`; inaudible stretches score 0)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape[0] > b.shape[0]:
        a, b = b, a
    na = np.linalg.norm(a)
    if na == 0.0:
        return 0.0
    num = correlate(b, a, mode="valid", method="fft")
    energy = np.concatenate(([0.0], np.cumsum(b * b)))
    local_energy = energy[a.shape[0]:] - energy[: -a.shape[0]]
    audible = local_energy > a.shape[0] * MIN_COPY_RMS**2
    if not audible.any():
        return 0.0
    return float(np.max(np.abs(num[audible]) / (na * np.sqrt(local_energy[audible]))))


def windowed_max_xcorr(x: np.ndarray, y: np.ndarray, window_s: float = 0.5, max_lag_s: float = 0.2,
                       min_rms: float = 0.01) -> float:
    """max over the half-second windows of ``y`` louder than ``min_rms`` of :func:`max_xcorr` with ``x`` from
    ``max_lag_s`` before the window to its end (16 kHz): how much ``y`` repeats ``x`` delayed by up to
    ``max_lag_s`` (a copy scores 1, however scaled); 0 when ``y`` has no audible window."""
    w, lag, best = int(window_s * SAMPLE_RATE_HZ), int(max_lag_s * SAMPLE_RATE_HZ), 0.0
    for i in range(0, len(y) - w + 1, w):
        seg = y[i:i + w]
        if np.sqrt(np.mean(np.square(seg, dtype=np.float64))) > min_rms and np.any(x[max(0, i - lag):i + w]):
            best = max(best, max_xcorr(seg, x[max(0, i - lag):i + w]))
    return best


def envelope(x: np.ndarray, sample_rate_hz: int = SAMPLE_RATE_HZ, frame_ms: float = 1.0,
             smooth_ms: float = 10.0) -> np.ndarray:
    """Log energy in dB per ``frame_ms`` frame, smoothed over ``smooth_ms``."""
    hop = max(1, int(sample_rate_hz * frame_ms / 1000))
    n = x.shape[0] // hop
    e = np.square(np.asarray(x[: n * hop], np.float64)).reshape(n, hop).mean(axis=1)
    k = max(1, int(smooth_ms / frame_ms))
    e = np.convolve(e, np.ones(k) / k, mode="same")
    return 10.0 * np.log10(e + 1e-10)


def envelope_delay_s(ref: np.ndarray, rec: np.ndarray, sample_rate_hz: int = SAMPLE_RATE_HZ,
                     max_delay_s: float = 1.0, floor_db: float = -60.0, min_delay_s: float = 0.0) -> float:
    """How many seconds ``rec`` lags ``ref`` (1 ms resolution), searched in
    [``min_delay_s``, ``max_delay_s``]."""
    er = np.maximum(envelope(ref, sample_rate_hz), floor_db) - floor_db
    ec = np.maximum(envelope(rec, sample_rate_hz), floor_db) - floor_db
    er -= er.mean()
    ec -= ec.mean()
    full = correlate(ec, er, mode="full", method="fft")
    lags = np.arange(-er.shape[0] + 1, ec.shape[0])
    keep = (lags >= int(min_delay_s * 1000)) & (lags <= int(max_delay_s * 1000))
    return float(lags[keep][np.argmax(full[keep])]) / 1000.0
