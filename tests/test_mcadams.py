"""The McAdams kernel and stage."""

import numpy as np

from rtanon.config import McAdamsConfig
from rtanon.stages.mcadams import McAdamsStage, mcadams_frame
from rtanon.stages.mcadams_kernels import lpc_autocorr as lpc


def _run(stage, x):
    n = stage.hop
    return np.concatenate([stage.process(c) for c in x[: x.shape[0] // n * n].reshape(-1, n)])


def test_alpha_one_reconstructs_the_input_exactly_delayed(speech):
    """With alpha = 1 the analysis/resynthesis is the identity: the windows and
    overlap-add are right. (alpha = 1 is not a valid configuration.)"""
    stage = McAdamsStage(McAdamsConfig(), 320, alpha=1.0)
    y = _run(stage, speech)
    d = stage.latency_samples
    np.testing.assert_allclose(y[d:], speech[: y.shape[0] - d], atol=1e-5)


def test_alpha_moves_the_formants(speech):
    """Pole angles phi -> phi**alpha: below 1 rad they rise, above they fall."""
    frame = speech[8000:8320].astype(np.float64) * np.hanning(320)
    a = lpc(frame, 20)
    out = mcadams_frame(frame, 0.8, 20)
    b = lpc(out * 1.0, 20)
    ang_in = np.sort(np.angle(np.roots(a)[np.roots(a).imag > 0]))
    ang_out = np.sort(np.angle(np.roots(b)[np.roots(b).imag > 0]))
    assert not np.allclose(ang_in, ang_out[: ang_in.shape[0]], atol=0.02)
    assert abs(np.dot(out, out) / np.dot(frame, frame) - 1.0) < 1e-6  # energy kept


def test_stage_output_is_finite_and_bounded_for_silence_and_impulses():
    stage = McAdamsStage(McAdamsConfig(), 320, alpha=0.8)
    x = np.zeros(3200, np.float32)
    x[1234] = 1.0
    y = _run(stage, x)
    assert np.isfinite(y).all()
    assert not _run(McAdamsStage(McAdamsConfig(), 320, alpha=0.8), np.zeros(3200, np.float32)).any()
