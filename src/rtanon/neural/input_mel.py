"""Log-mel spectra of the input audio, in numpy.

- :func:`mel_filterbank`: Slaney-style triangular mel filters (optionally on a warped frequency axis): the
  content encoder's front end (:mod:`rtanon.content.model`) and its training's vocal-tract-length
  perturbation (:mod:`rtanon.train.content`).
- :func:`log_mel_frames`: one log-mel frame per 20 ms frame of an utterance (the envelope probe's ``mel``
  input, :mod:`rtanon.train.envelope_probe`): frame ``t`` is a 512-sample Hann window centred on the
  frame's centre (samples ``[320 t - 96, 320 t + 416)``, zeros before the audio began), power spectrum,
  triangular mel bands from 0 to 8 kHz (:func:`mel_filterbank`), natural log.

Until 2026-12-02 these frames were also a second content input of the balanced vocoder; no vocoder reads
the input spectrum now (``docs/lab-notes/neural-vocoder.md``).
"""

from __future__ import annotations

import numpy as np

from rtanon.constants import FRAME_SAMPLES, SAMPLE_RATE_HZ

WINDOW = 512
#: samples after the end of frame t that its window reads
LOOKAHEAD = (WINDOW - FRAME_SAMPLES) // 2
_FLOOR = 1e-8
_HANN = np.hanning(WINDOW + 2)[1:-1].astype(np.float32)  # a 514-point Hann without its zero ends


def mel_filterbank(n_mels: int, n_fft: int = WINDOW, sr: int = SAMPLE_RATE_HZ, warp: float = 1.0,
                   fmin: float = 0.0, fmax: float = 8000.0) -> np.ndarray:
    """Triangular mel filters on the HTK mel scale (2595 log10(1 + f/700)), each normalised to unit area as
    Slaney's are, (n_mels, n_fft//2+1) float32. (The vocoder's training loss reads the Slaney scale itself:
    :func:`rtanon.train.losses.slaney_mel_filterbank`.)

    ``warp`` != 1 scales the frequency axis of the input (vocal-tract-length
    perturbation): the filter for frequency f reads the spectrum at f * warp.
    """
    def hz2mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def mel2hz(m):
        return 700.0 * (10.0 ** (np.asarray(m) / 2595.0) - 1.0)

    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1) / warp
    edges = mel2hz(np.linspace(hz2mel(fmin), hz2mel(fmax), n_mels + 2))
    fb = np.zeros((n_mels, len(freqs)), dtype=np.float64)
    for m in range(n_mels):
        lo, c, hi = edges[m], edges[m + 1], edges[m + 2]
        up = (freqs - lo) / (c - lo)
        down = (hi - freqs) / (hi - c)
        fb[m] = np.maximum(0.0, np.minimum(up, down)) * (2.0 / (hi - lo))
    return fb.astype(np.float32)


def log_mel_frames(audio: np.ndarray, bins: int, frames: int | None = None) -> np.ndarray:
    """``(..., frames, bins)`` float32 log-mel frames of ``audio`` ``(..., N)`` (float32 in [-1, 1] at 16 kHz;
    default: one frame per whole 20 ms of it), as the module docstring describes; samples before the audio
    and past its end read as zeros."""
    frames = audio.shape[-1] // FRAME_SAMPLES if frames is None else frames
    audio = np.asarray(audio, np.float32)
    need = FRAME_SAMPLES * (frames - 1) + WINDOW
    pad = [(0, 0)] * (audio.ndim - 1) + [(LOOKAHEAD, max(0, need - LOOKAHEAD - audio.shape[-1]))]
    x = np.pad(audio, pad)[..., :need]
    idx = FRAME_SAMPLES * np.arange(frames)[:, None] + np.arange(WINDOW)[None, :]
    spec = np.fft.rfft(x[..., idx] * _HANN, axis=-1)
    power = (spec.real ** 2 + spec.imag ** 2).astype(np.float32)
    return np.log(np.maximum(power @ mel_filterbank(bins).T, _FLOOR)).astype(np.float32)
