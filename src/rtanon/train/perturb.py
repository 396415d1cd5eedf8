"""Channel perturbation of training crops: a synthetic room and background noise.

A crop reverberated through a random room and mixed with coloured noise keeps the clean utterance's
targets, so what a room or a noisy microphone adds cannot help the content encoder (the
channel-side counterpart of ContentVec's speaker perturbation; issue 24 item 2).
"""

from __future__ import annotations

import numpy as np

from rtanon.constants import SAMPLE_RATE_HZ


def synthetic_rir(rng: np.random.Generator, rt60_s: float, drr_db: float, sr: int = SAMPLE_RATE_HZ) -> np.ndarray:
    """An impulse response: a unit direct path at sample 0 (the crop's timing is kept) and an
    exponentially decaying Gaussian tail from 2-6 ms on, falling 60 dB in ``rt60_s``, scaled so that
    the direct path's energy is ``drr_db`` above the tail's."""
    n = int(rt60_s * sr)
    start = int(rng.integers(int(0.002 * sr), int(0.006 * sr)))
    t = np.arange(n - start) / sr
    tail = rng.standard_normal(n - start) * np.exp(-6.908 * t / rt60_s)  # 10**(-3) in amplitude at rt60
    tail *= np.sqrt(10.0 ** (-drr_db / 10.0) / np.sum(tail ** 2))
    h = np.zeros(n)
    h[0] = 1.0
    h[start:] = tail
    return h


def coloured_noise(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Unit-RMS noise whose power falls as 1/f**exponent (0 white, 1 pink, 2 brown)."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n)
    f[0] = f[1]
    y = np.fft.irfft(spec * f ** (-exponent / 2.0), n)
    return y / (np.sqrt(np.mean(y ** 2)) + 1e-12)


def room_and_noise(x: np.ndarray, rng: np.random.Generator, rt60_s: tuple[float, float] = (0.15, 0.9),
                   drr_db: tuple[float, float] = (-3.0, 12.0), snr_db: tuple[float, float] = (5.0, 25.0)):
    """``x`` (float32) through a random room (RT60 and direct-to-reverberant ratio uniform in the given
    ranges) on half of the calls, and coloured noise (uniform SNR to the crop's RMS) on the other half
    and on half of the rooms. The output has ``x``'s length and RMS."""
    from scipy.signal import fftconvolve

    rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) + 1e-9
    room = rng.random() < 0.5
    noise = not room or rng.random() < 0.5
    y = x.astype(np.float64)
    if room:
        y = fftconvolve(y, synthetic_rir(rng, rng.uniform(*rt60_s), rng.uniform(*drr_db)))[:len(x)]
    if noise:
        y = y + coloured_noise(rng, len(x), rng.uniform(0.0, 2.0)) * rms * 10.0 ** (-rng.uniform(*snr_db) / 20.0)
    y *= rms / (np.sqrt(np.mean(y ** 2)) + 1e-12)
    return y.astype(np.float32)
