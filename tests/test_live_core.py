"""The live loop without a sound card: callbacks driven by a fake device clock.

Overload (a worker slower than real time) and exceptions must give comfort
noise on the output, never the microphone signal."""

import time

import numpy as np
import pytest

from rtanon import Anonymizer
from rtanon.analysis import max_xcorr
from rtanon.live import LiveConfig, LiveCore
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
