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


def _speech_frames(speech, n=320):
    win = np.sqrt(0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n))
    x = speech.astype(np.float64)
    frames = np.stack([x[i : i + n] * win for i in range(0, x.shape[0] - n, n // 2)])
    return frames[np.einsum("ij,ij->i", frames, frames) > 1e-9]


def test_the_iterated_poles_are_the_companion_eigenvalues_on_speech(speech):
    from rtanon.stages.mcadams_kernels import companion, lpc_polys, lpc_roots_rows

    polys = lpc_polys(_speech_frames(speech), 20)
    poles, ok = lpc_roots_rows(polys)
    assert ok.all()
    for a, p in zip(polys, poles):
        ref = np.linalg.eigvals(companion(a))
        assert np.abs(p[:, None] - ref[None, :]).min(axis=1).max() < 1e-9  # every root is one of them
        assert np.abs(ref[:, None] - p[None, :]).min(axis=1).max() < 1e-9  # and every one of them is found
        assert np.sum(p.imag > 0) == np.sum(p.imag < 0) == np.sum(ref.imag > 0)  # pairs as LAPACK has them


def test_batched_frames_equal_the_eigenvalue_reference_and_the_fallback_too(speech, monkeypatch):
    """The stage's frames (Aberth-Ehrlich poles) against ``mcadams_frame`` (LAPACK's), and the same with
    every frame sent to the fallback, as a frame where the iteration fails would be."""
    from rtanon.stages import mcadams

    frames = _speech_frames(speech)[:200]
    ref = np.stack([mcadams_frame(f, 0.8, 20) for f in frames])
    got = mcadams._FRAMES.run_batch([(frames, 0.8, 20)])[0]
    np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-9)
    failing = mcadams.lpc_roots_rows

    def nothing_converges(polys):
        poles, ok = failing(polys)
        return poles * np.nan, np.zeros_like(ok)

    monkeypatch.setattr(mcadams, "lpc_roots_rows", nothing_converges)
    np.testing.assert_allclose(mcadams._FRAMES.run_batch([(frames, 0.8, 20)])[0], ref, rtol=1e-7, atol=1e-9)


def test_an_iteration_that_does_not_converge_says_so():
    from rtanon.stages.mcadams_kernels import lpc_roots

    a = np.array([1.0, -1.8, 0.9])
    out = np.empty(2, np.complex128)
    assert not lpc_roots(a, out, 0)
    assert lpc_roots(a, out) and np.allclose(np.sort_complex(out), np.sort_complex(np.roots(a)))
