"""The input's spectral envelope per 20 ms frame: the vocoder's optional second content input.

``VocoderConfig.input_mel_bins = M > 0`` appends to each 50 Hz content frame
the log-mel spectrum of the speaker's own audio around it: frame ``t`` is a
512-sample Hann window centred on the frame's centre (samples
``[320 t - 96, 320 t + 416)``, zeros before the stream began), power
spectrum, ``M`` triangular mel bands from 0 to 8 kHz, natural log. The
vocoder keeps only its cepstral shape (coefficients 1..C of a DCT: no
loudness, little pitch; ``VocoderConfig.input_cepstra``), so it says where
the formants are, which the content encoder's ``z`` (distilled from an ASR
model on 2.9 h of speech) says only vaguely.

Where the formants are also says who is speaking. Training therefore hides
the speaker in this input (NANSY-style information perturbation, Choi et al.
2021): each segment's spectrum is read through a randomly warped mel
filterbank (vocal-tract-length perturbation by a factor in
``[1 / MAX_WARP, MAX_WARP]``) with a random spectral tilt, while the target
stays the speaker's own audio, so the voice must come from the speaker
embedding. Whether that hides enough is what the evaluation's attackers
measure (``models/neural/README.md``).

The 96 samples after a frame are within the 20 ms the content encoder waits
anyway, so the input costs no latency. One implementation serves the
streaming stage (:class:`InputMelStream`), offline calls and training
(:func:`log_mel_frames`).
"""

from __future__ import annotations

import numpy as np

from rtanon.neural.rates import HOP_SAMPLES

WINDOW = 512
#: samples after the end of frame t that its window reads
LOOKAHEAD = (WINDOW - HOP_SAMPLES) // 2
#: training's vocal-tract-length perturbation: warp factors in [1 / MAX_WARP, MAX_WARP]
MAX_WARP = 1.22
#: training's random spectral tilt: up to this many natural-log units from 0 to 8 kHz (about +-8.7 dB)
MAX_TILT = 1.0
_FLOOR = 1e-8
_HANN = np.hanning(WINDOW + 2)[1:-1].astype(np.float32)  # a 514-point Hann without its zero ends


def mel_basis(bins: int, warp: float = 1.0) -> np.ndarray:
    """(bins, 257) float32 filters of a 512-point spectrum; ``warp`` reads frequency f at f * warp."""
    from rtanon.content.config import mel_filterbank

    return mel_filterbank(bins, WINDOW, warp=warp)


def frame_power(audio: np.ndarray, frames: int, lead: int = LOOKAHEAD) -> np.ndarray:
    """Power spectra ``(..., frames, 257)`` of ``audio`` ``(..., N)`` (float32 in [-1, 1]), one per 20 ms
    frame as described in the module docstring, after ``lead`` zeros (the samples before frame 0's start);
    samples past the end of ``audio`` read as zeros."""
    audio = np.asarray(audio, np.float32)
    need = HOP_SAMPLES * (frames - 1) + WINDOW
    pad = [(0, 0)] * (audio.ndim - 1) + [(lead, max(0, need - lead - audio.shape[-1]))]
    x = np.pad(audio, pad)[..., :need]
    idx = HOP_SAMPLES * np.arange(frames)[:, None] + np.arange(WINDOW)[None, :]
    spec = np.fft.rfft(x[..., idx] * _HANN, axis=-1)
    return (spec.real ** 2 + spec.imag ** 2).astype(np.float32)


def log_mel(power: np.ndarray, basis: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(power @ basis.T, _FLOOR)).astype(np.float32)


def log_mel_frames(audio: np.ndarray, bins: int, frames: int | None = None) -> np.ndarray:
    """``(..., frames, bins)`` log-mel frames of ``audio`` (default: one per whole 20 ms of it)."""
    frames = audio.shape[-1] // HOP_SAMPLES if frames is None else frames
    return log_mel(frame_power(audio, frames), mel_basis(bins))


def warped_log_mel(power: np.ndarray, bins: int, warp: float, tilt: float) -> np.ndarray:
    """Log-mel of ``power`` ``(frames, 257)`` read through filters warped by ``warp`` (frequency f read at
    f * warp: formants move to f / warp), plus ``tilt`` natural-log units from the lowest band to the highest."""
    return log_mel(power, mel_basis(bins, warp)) + np.float32(tilt) * np.linspace(-0.5, 0.5, bins, dtype=np.float32)


def perturbed_log_mel(audio: np.ndarray, bins: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """Training: :func:`log_mel_frames` of each row of ``audio`` ``(B, N)`` through its own random warp
    (log-uniform in [1 / MAX_WARP, MAX_WARP]) and tilt (uniform in +-MAX_TILT) -> ``(B, frames, bins)``."""
    power = frame_power(audio, frames)
    warps = np.exp(rng.uniform(-np.log(MAX_WARP), np.log(MAX_WARP), size=audio.shape[0]))
    tilts = rng.uniform(-MAX_TILT, MAX_TILT, size=audio.shape[0])
    return np.stack([warped_log_mel(p, bins, float(w), float(t)) for p, w, t in zip(power, warps, tilts)])


def cepstral_matrix(bins: int, cepstra: int) -> np.ndarray:
    """(cepstra, bins) float32: rows 1..cepstra of the orthonormal DCT-II (row 0, the loudness, is left out)."""
    m = np.arange(bins)
    k = np.arange(1, cepstra + 1)[:, None]
    return (np.sqrt(2.0 / bins) * np.cos(np.pi * k * (m + 0.5) / bins)).astype(np.float32)


def voice_warp(embedding: np.ndarray) -> tuple[float, float]:
    """The warp and tilt a session reads its input through, drawn as training draws them but seeded by the
    pseudo-speaker's embedding: one voice always gets the same (a pinned identity sounds the same in every
    session), a fresh voice a fresh one."""
    import hashlib

    seed = int.from_bytes(hashlib.sha256(np.asarray(embedding, np.float32).tobytes()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    return float(np.exp(rng.uniform(-np.log(MAX_WARP), np.log(MAX_WARP)))), float(rng.uniform(-MAX_TILT, MAX_TILT))


class InputMelStream:
    """One session's log-mel frames, streaming: ``process(chunk)`` returns the frames ``(n, bins)`` whose
    window the input now covers, the same as :func:`log_mel_frames` over the whole stream (with ``warp``
    and ``tilt``: as :func:`warped_log_mel`)."""

    def __init__(self, bins: int, warp: float = 1.0, tilt: float = 0.0) -> None:
        self.bins, self.warp, self.tilt = bins, warp, tilt
        self.basis = mel_basis(bins, warp)
        self._tilt = np.float32(tilt) * np.linspace(-0.5, 0.5, bins, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        self._buf = np.zeros(LOOKAHEAD, np.float32)  # the zeros before the stream

    def process(self, chunk: np.ndarray) -> np.ndarray:
        self._buf = np.concatenate([self._buf, np.asarray(chunk, np.float32)])
        n = (self._buf.shape[0] - WINDOW) // HOP_SAMPLES + 1 if self._buf.shape[0] >= WINDOW else 0
        if n == 0:
            return np.zeros((0, self.bins), np.float32)
        out = log_mel(frame_power(self._buf, n, lead=0), self.basis) + self._tilt
        self._buf = self._buf[HOP_SAMPLES * n:]
        return out
