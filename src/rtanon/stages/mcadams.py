"""McAdams-coefficient anonymization, streaming (VoicePrivacy baseline B2).

Per 20 ms frame (10 ms hop, square-root Hann analysis and synthesis windows,
which overlap-add to one): LPC analysis, the angle φ of every complex pole
pair moved to φ**α, the LPC residual re-filtered through the modified
all-pole filter, the frame's energy kept, overlap-add. α < 1 raises low
formants and lowers high ones, which changes the perceived speaker while the
excitation (pitch, timing) is kept. The per-sample loops and the pole search
(Aberth-Ehrlich, LAPACK's eigenvalues where it fails) run in Numba
(``mcadams_kernels``).
"""

from __future__ import annotations

import numpy as np

from rtanon.batch import Call, Steps, run_alone
from rtanon.config import McAdamsConfig
from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.stages.base import check_chunk
from rtanon.stages.mcadams_kernels import (companion, lpc_autocorr, lpc_polys, lpc_roots_rows, resynthesize,
                                           resynthesize_rows)

_EPS = 1e-9


def mcadams_frame(frame: np.ndarray, alpha: float, order: int) -> np.ndarray:
    """Applies the McAdams transform to one windowed frame (float64 in, float64
    out, same length). ``alpha == 1`` returns the frame unchanged (up to
    rounding), which the tests use to check the resynthesis."""
    a = lpc_autocorr(frame, order)
    poles = np.linalg.eigvals(companion(a))
    return resynthesize(frame, a, poles, float(alpha))


class McAdamsStage:
    """Streaming McAdams anonymizer for one session.

    ``process(chunk)``: ``hop`` samples of 16 kHz mono float32 in [-1, 1] ->
    the same number of anonymized samples, delayed by ``latency_samples``
    (half a window: 10 ms). ``alpha`` is fixed for the session and kept by
    ``reset()``.
    """

    def __init__(self, config: McAdamsConfig, hop: int, alpha: float) -> None:
        self._window = config.window_ms * SAMPLE_RATE_HZ // 1000
        self._frame_hop = self._window // 2
        if hop % self._frame_hop:
            raise ValueError(f"McAdams hop must be a multiple of {self._frame_hop} samples, got {hop}")
        self._hop = hop
        self._order = config.lpc_order
        self.alpha = float(alpha)
        n = np.arange(self._window)
        self._win = np.sqrt(0.5 - 0.5 * np.cos(2.0 * np.pi * n / self._window))  # sqrt periodic Hann
        self.reset()

    @property
    def hop(self) -> int:
        return self._hop

    @property
    def latency_samples(self) -> int:
        return self._window - self._frame_hop

    def reset(self) -> None:
        self._pending = np.zeros(self._window - self._frame_hop)
        self._ola = np.zeros(self._window)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        return run_alone(self.steps(chunk))

    def steps(self, chunk: np.ndarray) -> Steps:
        """``process`` with the chunk's frames handed to the shared frame transform as one call
        (:mod:`rtanon.batch`: one call for every session's frames)."""
        check_chunk(chunk, self._hop, "McAdamsStage")
        pending = np.concatenate((self._pending, chunk.astype(np.float64)))
        fh, win = self._frame_hop, self._win
        frames = np.stack([pending[k * fh : k * fh + self._window] * win for k in range(self._hop // fh)])
        voiced = np.einsum("ij,ij->i", frames, frames) > _EPS
        if voiced.any():
            shaped = yield Call(_FRAMES, (self._window, self._order), (frames[voiced], self.alpha, self._order))
        out = np.empty(self._hop, dtype=np.float32)
        j = 0
        for k in range(frames.shape[0]):
            if voiced[k]:
                self._ola += shaped[j] * win
                j += 1
            out[k * fh : (k + 1) * fh] = self._ola[:fh]
            self._ola[:-fh] = self._ola[fh:]
            self._ola[-fh:] = 0.0
        self._pending = pending[self._hop :]
        return out


class _FrameTransform:
    """``mcadams_frame`` of many frames at once: rows of ``(frames (k, n), alpha, order)`` with one n and
    order -> each row's transformed frames ``(k, n)``. The poles by Aberth-Ehrlich iteration; a frame
    where it fails gets the companion matrix's eigenvalues, as ``mcadams_frame`` (1 of 41,934 speech frames
    of 100 so762_dev and libri_devclean utterances; roots within 6e-13 of LAPACK's on the others)."""

    #: the Numba kernels release the GIL: a server's workers run parts of a batch at once (:mod:`rtanon.batch`)
    splits = True

    def run_batch(self, rows) -> list[np.ndarray]:
        frames = np.concatenate([r[0] for r in rows])
        alphas = np.concatenate([np.full(r[0].shape[0], r[1]) for r in rows])
        polys = lpc_polys(frames, rows[0][2])
        poles, ok = lpc_roots_rows(polys)
        for i in np.flatnonzero(~ok):
            poles[i] = np.linalg.eigvals(companion(polys[i]))
        out = resynthesize_rows(frames, polys, poles, alphas)
        return np.split(out, np.cumsum([r[0].shape[0] for r in rows])[:-1])


_FRAMES = _FrameTransform()
