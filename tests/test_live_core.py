"""The live loop without a sound card: callbacks driven by a fake device clock.

Overload (a worker slower than real time) and exceptions must give comfort
noise on the output, never the microphone signal."""

import time

import numpy as np
import pytest

from rtanon import Anonymizer
from rtanon.eval.signal import max_xcorr
from rtanon.live.config import LiveConfig
from rtanon.live.core import LiveCore
from stage_doubles import SlowStage


def _drive(core, x, block, realtime=True):
    """Feeds ``x`` in ``block``-sample input callbacks and pulls as many output
    samples, at real-time pace (the device clock)."""
    out = []
    period = block / core.in_rate_hz
    t_next = time.monotonic()
    core.start()
    try:
        for i in range(0, x.shape[0] - block + 1, block):
            core.on_input(np.ascontiguousarray(x[i : i + block]))
            while not realtime and core.input_backlog >= block:  # as fast as the worker goes
                time.sleep(0.0005)
            buf = np.empty(block * core.out_rate_hz // core.in_rate_hz, np.float32)
            core.on_output(buf)
            out.append(buf)
            if realtime:
                t_next += period
                time.sleep(max(0.0, t_next - time.monotonic()))
    finally:
        core.stop()
    return np.concatenate(out)


class _Boom(SlowStage):
    def process(self, chunk):
        raise RuntimeError("injected failure")


def test_normal_run_outputs_anonymized_speech_with_few_missed_deadlines(speech):
    session = Anonymizer().open_session(seed=0)
    y = _drive(LiveCore(session, 16000, 16000), speech, 160)
    assert np.sqrt(np.mean(y**2)) > 0.3 * np.sqrt(np.mean(speech**2))
    assert max_xcorr(speech, y) < 0.5


@pytest.mark.parametrize("rates", [(48000, 48000), (44100, 16000)])
def test_device_rates_are_resampled_both_ways(speech, rates):
    import soxr

    in_rate, out_rate = rates
    x = soxr.resample(speech, 16000, in_rate).astype(np.float32)
    session = Anonymizer().open_session(seed=0)
    y = _drive(LiveCore(session, in_rate, out_rate), x, in_rate // 100, realtime=False)
    assert y.shape[0] == (x.shape[0] // (in_rate // 100)) * (out_rate // 100)
    assert np.isfinite(y).all()
    assert session.counters.speech_chunks > 0


def test_overload_plays_comfort_noise_not_the_input(speech):
    session = Anonymizer().open_session(seed=0)
    session.stages = [SlowStage(s, 0.05) for s in session.stages]  # 50 ms per 20 ms chunk
    core = LiveCore(session, 16000, 16000, LiveConfig(max_queue_ms=200))
    y = _drive(core, speech, 160)
    assert session.counters.missed_deadlines > 10
    assert np.isfinite(y).all()
    assert max_xcorr(speech, y) < 0.5
    assert max_xcorr(speech, speech) > 0.9


def test_stage_exception_in_live_gives_only_comfort_noise(speech):
    session = Anonymizer().open_session(seed=0)
    session.stages = [_Boom(s, 0.0) for s in session.stages]
    y = _drive(LiveCore(session, 16000, 16000), speech, 160, realtime=False)
    assert session.counters.stage_errors > 0
    level = Anonymizer().config.vad.comfort_noise_dbfs
    assert 20 * np.log10(np.sqrt(np.mean(y.astype(np.float64) ** 2))) < level + 3
    assert max_xcorr(speech, y) < 0.2


def test_output_callback_always_fills_the_whole_buffer_before_any_input():
    session = Anonymizer().open_session(seed=0)
    core = LiveCore(session, 48000, 48000)
    buf = np.full(480, np.nan, np.float32)
    core.on_output(buf)
    assert np.isfinite(buf).all() and np.abs(buf).max() < 0.01
    assert session.counters.missed_deadlines == 0  # warm-up is not a missed deadline


def test_input_ring_overflow_is_counted():
    session = Anonymizer().open_session(seed=0)
    core = LiveCore(session, 16000, 16000)  # worker not started: nothing drains the ring
    for _ in range(5):
        core.on_input(np.zeros(16000, np.float32))
    assert session.counters.input_overflows > 0


def _conversation(speech, turns=4, talk_s=1.0, pause_s=0.6):
    """Utterances of ``talk_s`` with ``pause_s`` of near-silence between them (and after the last)."""
    rng = np.random.default_rng(0)
    talk, pause = int(16000 * talk_s), int(16000 * pause_s)
    parts = []
    for i in range(turns):
        parts.append(speech[i * talk : (i + 1) * talk])
        parts.append((1e-4 * rng.standard_normal(pause)).astype(np.float32))
    return np.concatenate(parts)


@pytest.mark.parametrize("bounded", [True, False])
def test_overload_delay_is_given_back_at_pauses_and_announced(speech, bounded):
    """Issue "a new user's first hour": under load the delay grew from 65 to 210 ms and stayed there.
    With compute 1.3 times slower than real time, each utterance puts the queues behind; the pause after
    it is dropped unrendered until they hold at most ``overload_ms``, and the status says why. Without the
    bound (``overload_ms`` = ``max_queue_ms``) the same load puts the queues well beyond it, so the bounded
    run's figure is the bound's doing. (The control's delay at the end is not asserted: the output queue's
    own slow trim of non-speech gives some back, by how much depends on the machine's load.)"""
    from rtanon.config import AnonymizerConfig

    session = Anonymizer(AnonymizerConfig(method="mcadams")).open_session(seed=0)
    session.stages = [SlowStage(session.stages[0], 0.026)] + session.stages[1:]  # 27 ms per 20 ms chunk
    cfg = LiveConfig(max_queue_ms=200, overload_ms=60 if bounded else 200)
    core = LiveCore(session, 16000, 16000, cfg)
    notes = []
    x = _conversation(speech)
    behind = []
    y = _drive_sampling(core, x, 160, notes, behind)
    assert np.isfinite(y).all() and max_xcorr(x, y) < 0.5  # never the raw voice
    print(f"\nbehind: max {max(behind):.0f} ms, last {behind[-1]:.0f} ms, drops {core.overload_drops}")
    bound = 60 + 20 + 10  # the bound, a chunk and a block
    if bounded:
        assert core.overload_drops > 0
        assert behind[-1] <= bound
        assert any(n and "--chunk-ms" in n for n in notes)  # announced, with the fix
    else:
        assert max(behind) > bound + 30, behind  # the load really puts the queues behind


def _behind_ms(core) -> float:
    return core.queued_ms + 1000.0 * core.input_backlog / 16000


def _drive_sampling(core, x, block, notes, behind):
    """``_drive`` at real-time pace, asking the core for its overload note and its delay every 100 ms (as the
    status does), and its delay once more when the worker stopped."""
    out = []
    period = block / core.in_rate_hz
    t_next = time.monotonic()
    core.start()
    try:
        for k, i in enumerate(range(0, x.shape[0] - block + 1, block)):
            core.on_input(np.ascontiguousarray(x[i : i + block]))
            buf = np.empty(block, np.float32)
            core.on_output(buf)
            out.append(buf)
            if k % 10 == 0:
                notes.append(core.overload_note())
                behind.append(_behind_ms(core))
            t_next += period
            time.sleep(max(0.0, t_next - time.monotonic()))
    finally:
        core.stop()
    behind.append(_behind_ms(core))
    return np.concatenate(out)
