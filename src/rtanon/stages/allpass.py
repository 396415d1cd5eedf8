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
from scipy.signal import sosfilt

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
        check_chunk(chunk, self._hop, "AllPassStage")
        out, self._zi = sosfilt(self._sos, chunk, zi=self._zi)
        return out.astype(np.float32)
