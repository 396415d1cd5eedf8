"""The input's spectral shape per 20 ms frame: an optional second content input of a vocoder
(the balanced point's until 2026-12-02; no shipped vocoder reads it now).

A vocoder with ``VocoderConfig.input_mel_bins = M > 0`` reads, beside the
content encoder's ``z``, the log-mel spectrum of the speaker's own audio
around each 50 Hz frame: frame ``t`` is a 512-sample Hann window centred on the frame's centre (samples
``[320 t - 96, 320 t + 416)``, zeros before the stream began), power
spectrum, ``M`` triangular mel bands from 0 to 8 kHz, natural log. The graph
keeps only its cepstral shape (DCT coefficients 1..C, ``input_cepstra``: no
loudness, little pitch), which says where the formants are, what ``z``
says only vaguely.

Where the formants are also says who is speaking; training reads this input
through a random vocal-tract-length warp and tilt
(:func:`rtanon.train.vocoder.perturbed_log_mel`) while the target stays the
speaker's own audio, so that the voice must come from the speaker embedding.
How much of the speaker still gets through is what the evaluation's attackers
measure (``models/neural/MODEL_CARD.md``).

With ``VocoderConfig.input_cmn_frames = W > 0`` each log-mel frame has the
mean of the last ``W`` frames (itself included; fewer at the start of a
stream) taken away before the graph reads it (:func:`mean_normalise`). What
stays is how the spectrum moves from sound to sound; the speaker's average
spectral shape (and the microphone's) goes, and with it most of what a
frame-level speaker classifier finds in these cepstra (the model card has the
held-out figures).

The 96 samples after a frame are within the 20 ms the content encoder waits
anyway, so this input costs no latency. One implementation serves the
streaming stage (:class:`InputMelStream`) and training (:func:`frame_power`,
:func:`log_mel`).
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
    """Slaney-style triangular mel filters, (n_mels, n_fft//2+1) float32.

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


def frame_power(audio: np.ndarray, frames: int, lead: int = LOOKAHEAD) -> np.ndarray:
    """Power spectra ``(..., frames, 257)`` of ``audio`` ``(..., N)`` (float32 in [-1, 1]), one per 20 ms
    frame as described in the module docstring, after ``lead`` zeros (the samples before frame 0's start);
    samples past the end of ``audio`` read as zeros."""
    audio = np.asarray(audio, np.float32)
    need = FRAME_SAMPLES * (frames - 1) + WINDOW
    pad = [(0, 0)] * (audio.ndim - 1) + [(lead, max(0, need - lead - audio.shape[-1]))]
    x = np.pad(audio, pad)[..., :need]
    idx = FRAME_SAMPLES * np.arange(frames)[:, None] + np.arange(WINDOW)[None, :]
    spec = np.fft.rfft(x[..., idx] * _HANN, axis=-1)
    return (spec.real ** 2 + spec.imag ** 2).astype(np.float32)


def log_mel(power: np.ndarray, basis: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(power @ basis.T, _FLOOR)).astype(np.float32)


def log_mel_frames(audio: np.ndarray, bins: int, frames: int | None = None) -> np.ndarray:
    """``(..., frames, bins)`` log-mel frames of ``audio`` (default: one per whole 20 ms of it)."""
    frames = audio.shape[-1] // FRAME_SAMPLES if frames is None else frames
    return log_mel(frame_power(audio, frames), mel_filterbank(bins))


def cepstral_matrix(bins: int, cepstra: int) -> np.ndarray:
    """(cepstra, bins) float32: rows 1..cepstra of the orthonormal DCT-II (row 0, the loudness, is left out)."""
    m = np.arange(bins)
    k = np.arange(1, cepstra + 1)[:, None]
    return (np.sqrt(2.0 / bins) * np.cos(np.pi * k * (m + 0.5) / bins)).astype(np.float32)


def mean_normalise(frames: np.ndarray, window: int, first: np.ndarray | int = 0) -> np.ndarray:
    """Causal mean normalisation of ``frames`` ``(..., T, bins)``: frame t minus the mean of frames
    ``max(t - window + 1, first) .. t``. ``first`` (an int or one per leading row) is where the stream began:
    frames before it are history that does not exist (training's zero padding) and are never averaged; the
    frames before ``first`` come back unchanged."""
    frames = np.asarray(frames, np.float32)
    t = np.arange(frames.shape[-2])
    first = np.asarray(first)[..., None]
    lo = np.maximum(t - window + 1, first)  # (..., T)
    csum = np.concatenate([np.zeros_like(frames[..., :1, :]), np.cumsum(frames, axis=-2, dtype=np.float64)],
                          axis=-2)
    hi = np.maximum(t + 1, lo + 1)
    total = np.take_along_axis(csum, np.broadcast_to(hi, frames.shape[:-1])[..., None], axis=-2) \
        - np.take_along_axis(csum, np.broadcast_to(lo, frames.shape[:-1])[..., None], axis=-2)
    mean = total / (hi - lo)[..., None]
    out = (frames - mean).astype(np.float32)
    return np.where((t < first)[..., None], frames, out)


class InputMelStream:
    """One session's log-mel frames, streaming: ``process(chunk)`` returns the frames ``(n, bins)`` whose
    window the input now covers, the same as :func:`log_mel_frames` over the whole stream (then
    :func:`mean_normalise` over ``cmn_frames`` frames, when > 0)."""

    def __init__(self, bins: int, cmn_frames: int = 0) -> None:
        self.bins = bins
        self.cmn_frames = cmn_frames
        self.basis = mel_filterbank(bins)
        self.reset()

    def reset(self) -> None:
        self._buf = np.zeros(LOOKAHEAD, np.float32)  # the zeros before the stream
        self._history = np.zeros((0, self.bins), np.float32)  # the last cmn_frames - 1 frames, unnormalised

    def process(self, chunk: np.ndarray) -> np.ndarray:
        self._buf = np.concatenate([self._buf, np.asarray(chunk, np.float32)])
        n = (self._buf.shape[0] - WINDOW) // FRAME_SAMPLES + 1 if self._buf.shape[0] >= WINDOW else 0
        if n == 0:
            return np.zeros((0, self.bins), np.float32)
        out = log_mel(frame_power(self._buf, n, lead=0), self.basis)
        self._buf = self._buf[FRAME_SAMPLES * n:]
        if self.cmn_frames:  # mean_normalise's arithmetic, for the new frames only (a stream is one chunk at a time)
            seen = np.concatenate([self._history, out])
            h = len(self._history)
            out = np.stack([out[i] - seen[max(0, h + i - self.cmn_frames + 1):h + i + 1].mean(axis=0, dtype=np.float64)
                            for i in range(n)]).astype(np.float32)
            self._history = seen[max(0, len(seen) - (self.cmn_frames - 1)):]
        return out
