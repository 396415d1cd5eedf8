"""Sessions run batched (``rtanon.batch.run_batched``) give what they give alone, and one session's
failure stays its own."""

from __future__ import annotations

import numpy as np
import pytest

from rtanon.io.audio import read_audio
import threading

from rtanon.batch import Call, Failed, Workers, run_alone, run_batched
from rtanon.config import AnonymizerConfig
from rtanon.engine import Anonymizer


class Doubler:
    """A toy runner: doubles each row; a negative row makes the whole batch raise."""

    def __init__(self):
        self.calls = []

    def run_batch(self, rows):
        self.calls.append(len(rows))
        if any(r[0] < 0 for r in rows):
            raise ValueError("negative row")
        return [2 * r[0] for r in rows]


def two_calls(runner, x):
    try:
        a = yield Call(runner, None, (x,))
        b = yield Call(runner, None, (a + 1,))
    except ValueError as exc:
        return f"failed: {exc}"
    return b


def test_rows_of_one_round_share_one_call_and_a_failing_row_fails_alone():
    runner = Doubler()
    assert run_alone(two_calls(runner, 3)) == 14
    runner.calls.clear()
    results = run_batched([two_calls(runner, x) for x in (1, -5, 2, 3)])
    assert results == [6, "failed: negative row", 10, 14]
    # round 1: the batch of 4 fails, then each row alone (4 calls); round 2: the 3 survivors in one call
    assert runner.calls == [4, 1, 1, 1, 1, 3]


class SplittingDoubler(Doubler):
    """``Doubler`` that may be split across workers; notes the thread of each call."""

    splits = True

    def __init__(self):
        super().__init__()
        self.threads = set()

    def run_batch(self, rows):
        self.threads.add(threading.get_ident())
        return super().run_batch(rows)


def test_workers_split_a_splitting_runners_rows_and_a_failing_row_still_fails_alone():
    workers = Workers(2)
    try:
        runner = SplittingDoubler()
        stats: dict = {}
        results = run_batched([two_calls(runner, x) for x in (1, -5, 2, 3, 4)], stats, workers)
        assert results == [6, "failed: negative row", 10, 14, 18]
        # round 1: parts of 3 and 2 rows; the part with the bad row retried row by row; round 2: 2 + 2
        assert sorted(runner.calls) == sorted([3, 1, 1, 1, 2, 2, 2])
        assert len(runner.threads) == 2  # the caller's thread and the pool's
        assert stats["SplittingDoubler"] == {"calls": 5, "rows": 8}  # 2 + 1, then 2; the failed calls not counted
        plain = Doubler()  # a runner that does not say it splits runs as one call
        run_batched([two_calls(plain, x) for x in (1, 2, 3)], workers=workers)
        assert plain.calls == [3, 3]
    finally:
        workers.close()
    assert run_batched([two_calls(SplittingDoubler(), 1)], workers=workers) == [6]  # closed: the caller's thread


def test_an_exception_a_generator_does_not_catch_is_returned_not_raised():
    def bad(runner):
        yield Call(runner, None, (-1,))

    def good(runner):
        return (yield Call(runner, None, (1,)))

    runner = Doubler()
    results = run_batched([bad(runner), good(runner)])
    assert isinstance(results[0], Failed) and results[1] == 2


def chunks_of(path, n_chunks: int, chunk: int = 320) -> np.ndarray:
    x = read_audio(path)
    x = np.tile(x, -(-n_chunks * chunk // len(x)))
    return x[: n_chunks * chunk].reshape(n_chunks, chunk)


@pytest.mark.parametrize("method,workers", [("mcadams", 1), ("neural", 1), ("mcadams", 2), ("neural", 2)])
def test_batched_sessions_equal_the_same_sessions_alone(method, workers, speech_paths):
    """Four sessions (their own speech and pinned voices) stepped together, on one thread or with the
    splitting calls cut over two: every chunk equals what the same session gives alone, and the batch
    called each shared model once per round (per worker)."""
    anonymizer = Anonymizer(AnonymizerConfig(method=method))
    inputs = [chunks_of(speech_paths[i], 60) for i in range(4)]
    alone = [anonymizer.open_session(seed=10 + i) for i in range(4)]
    together = [anonymizer.open_session(seed=10 + i) for i in range(4)]
    stats: dict = {}
    pool = Workers(workers)
    for t in range(60):
        want = [s.process(inputs[i][t]) for i, s in enumerate(alone)]
        got = run_batched([s.steps(inputs[i][t]) for i, s in enumerate(together)], stats, pool)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=2e-4)
    pool.close()
    assert all(s.counters.stage_errors == 0 for s in together)
    assert sum(s.counters.rendered_chunks for s in together) > 0
    names = {"mcadams": {"_Correlation"}, "neural": {"_Correlation", "ContentEncoderModel", "StepRunner"}}[method]
    assert names <= set(stats)
    split = {"mcadams": {"_FrameTransform"}, "neural": {"ContentEncoderModel", "StepRunner"}}[method]
    for name in names:  # one call per round for all four sessions (two, of two rows, where split)
        per_call = 2 if workers == 2 and name in split else 3
        assert stats[name]["rows"] >= per_call * stats[name]["calls"], (name, stats[name])
    if workers == 2:
        assert all(stats[name]["rows"] <= 2 * stats[name]["calls"] for name in split), stats


def test_a_session_whose_vocoder_row_fails_gets_comfort_noise_and_the_others_do_not_notice(speech_paths):
    anonymizer = Anonymizer(AnonymizerConfig(method="neural"))
    inputs = [chunks_of(speech_paths[i], 40) for i in range(3)]
    alone = [anonymizer.open_session(seed=20 + i) for i in range(3)]
    together = [anonymizer.open_session(seed=20 + i) for i in range(3)]
    broken = together[1].stages[0].vocoder
    broken._speaker = np.full_like(broken._speaker[:, :3], 0.1)  # a wrong width: its row cannot run
    for t in range(40):
        want = [s.process(inputs[i][t]) for i, s in enumerate(alone)]
        got = run_batched([s.steps(inputs[i][t]) for i, s in enumerate(together)])
        for i in (0, 2):
            np.testing.assert_allclose(got[i], want[i], atol=2e-4)
        assert got[1].shape == (320,) and np.abs(got[1]).max() < 0.01  # comfort noise (or silence)
    assert together[1].counters.stage_errors > 0
    assert together[0].counters.stage_errors == together[2].counters.stage_errors == 0


def test_the_allpass_kernel_is_scipys_sosfilt_chunk_after_chunk(speech):
    from scipy.signal import sosfilt

    from rtanon.stages.allpass import AllPassStage

    stage = AllPassStage(320, 4, np.random.default_rng(3))
    x = speech[: 320 * 50].astype(np.float32)
    got = np.concatenate([stage.process(c) for c in x.reshape(-1, 320)])
    np.testing.assert_allclose(got, sosfilt(stage._sos, x).astype(np.float32), atol=1e-6)


def test_without_onnx_the_content_rows_run_one_by_one_with_the_same_result(speech):
    from rtanon.content.stream import ContentEncoderModel, _RowByRow

    model = ContentEncoderModel()
    rows = [(speech[i * 640: i * 640 + 640].astype(np.float32), model.init_state()) for i in range(3)]
    batched = model.run_batch(rows)  # the graph with a free batch axis (onnx is installed here)
    model._batched = _RowByRow(model)  # what _batched_session gives where onnx is missing
    for (probs, z, state), (probs1, z1, state1) in zip(batched, model.run_batch(rows)):
        np.testing.assert_allclose(z1, z, atol=1e-4)
        for a, b in zip(state1, state):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, atol=1e-4)
