"""Per-session random all-pass filter: scrambles the waveform, keeps the spectrum.

Signal-processing methods such as McAdams keep the input's excitation, so
their output waveform still correlates with the input (0.2-0.6 on so762_dev).
A cascade of second-order all-pass sections with random centre frequencies
(log-uniform over 80-4000 Hz, where voiced speech has its energy) and radii
(0.75-0.92), drawn once per session, rotates the phase differently at every
frequency: the magnitude spectrum, and so what a
listener or a speaker/ASR model hears, is unchanged, while the waveform no
longer matches the input at any lag. Causal, no lookahead; its group delay is
at most about 1.5 ms near each centre frequency.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rtanon.batch import Call, Steps, run_alone
from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.stages.base import check_chunk


class AllPassStage:
    """``process(chunk)``: ``hop`` float32 samples at 16 kHz -> the same
    number, all-pass filtered with this session's sections; ``reset()`` clears
    the filter memory and keeps the sections."""

    def __init__(self, hop: int, sections: int, rng: np.random.Generator) -> None:
        self._hop = hop
        radius = rng.uniform(0.75, 0.92, sections)
        w = 2.0 * np.pi * np.exp(rng.uniform(np.log(80.0), np.log(4000.0), sections)) / SAMPLE_RATE_HZ
        a1, a2 = -2.0 * radius * np.cos(w), radius**2
        # all-pass: numerator is the reversed denominator
        self._sos = np.stack([a2, a1, np.ones(sections), np.ones(sections), a1, a2], axis=1)
        self.reset()

    @property
    def hop(self) -> int:
        return self._hop

    @property
    def latency_samples(self) -> int:
        return 0

    def reset(self) -> None:
        self._zi = np.zeros((self._sos.shape[0], 2))

    def process(self, chunk: np.ndarray) -> np.ndarray:
        return run_alone(self.steps(chunk))

    def steps(self, chunk: np.ndarray) -> Steps:
        """``process`` as one row of the shared filter kernel (:mod:`rtanon.batch`: every session's chunk
        in one call)."""
        check_chunk(chunk, self._hop, "AllPassStage")
        out, self._zi = yield Call(_FILTER, (self._hop, self._sos.shape[0]), (chunk, self._sos, self._zi))
        return out


@njit(cache=True, nogil=True)
def _sos_rows(x, sos, zi):
    """Second-order sections, transposed direct form II (what ``scipy.signal.sosfilt`` computes), per row:
    ``x (R, n)``, ``sos (R, S, 6)``, ``zi (R, S, 2)`` -> ``y (R, n)`` float32 and the final state."""
    rows, n = x.shape
    y = np.empty((rows, n), np.float32)
    z = zi.copy()
    for r in range(rows):
        for t in range(n):
            v = np.float64(x[r, t])
            for s in range(sos.shape[1]):
                b0, b1, b2, a1, a2 = sos[r, s, 0], sos[r, s, 1], sos[r, s, 2], sos[r, s, 4], sos[r, s, 5]
                out = b0 * v + z[r, s, 0]
                z[r, s, 0] = b1 * v - a1 * out + z[r, s, 1]
                z[r, s, 1] = b2 * v - a2 * out
                v = out
            y[r, t] = v
    return y, z


class _Filter:
    """Rows of ``(chunk (n,), sos (S, 6), zi (S, 2))`` with one n and S -> each row's ``(y (n,) float32, zi)``."""

    def run_batch(self, rows) -> list:
        y, z = _sos_rows(np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows]),
                         np.stack([r[2] for r in rows]))
        return [(y[i], z[i]) for i in range(len(rows))]


_FILTER = _Filter()
