"""`rtanon.eval.signal.max_xcorr`, the yardstick of every fail-closed test: 1 for a copy, however quiet it is
while audible; never above 1 where the other signal falls silent."""

from __future__ import annotations

import numpy as np
import pytest

from rtanon.eval.signal import MIN_COPY_RMS, max_xcorr


@pytest.mark.parametrize("gain", [1.0, 1e-2, 1e-3])
def test_a_copy_scores_one_at_any_audible_level(gain):
    rng = np.random.default_rng(0)
    a = (0.1 * rng.standard_normal(1600)).astype(np.float32)
    b = np.concatenate([0.3 * rng.standard_normal(11000), gain * a, np.zeros(3000)]).astype(np.float32)
    assert max_xcorr(a, b) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("tail", ["zeros", "1e-9", "noise at -140 dBFS"])
def test_near_silence_never_scores_above_one(tail):
    # seen on the control page's test: a monitor recording that ended near digital silence scored 3.76,
    # the FFT's rounding divided by the near-zero energy under the segment
    rng = np.random.default_rng(1)
    a = (0.1 * rng.standard_normal(1600)).astype(np.float32)
    quiet = {"zeros": np.zeros(5000), "1e-9": np.full(5000, 1e-9),
             "noise at -140 dBFS": 1e-7 * rng.standard_normal(5000)}[tail]
    b = np.concatenate([0.3 * rng.standard_normal(11000), quiet]).astype(np.float32)
    assert max_xcorr(a, b) < 0.2
    assert max_xcorr(a, quiet.astype(np.float32)) == 0.0  # nothing audible: nothing copied
    assert MIN_COPY_RMS <= 1.0 / 32768  # a 16-bit copy is always above the floor
