"""The live loop's adaptive output queue (issue 44): a small margin kept after every output callback,
grown by what was missing at an underflow and shrunk back when steady; trims only where nothing but
comfort noise is queued (never a word cut), or while the device takes nothing (a stall: that audio
would play late). Driven with a fake clock: no timing in the assertions."""

import numpy as np
import pytest

from rtanon import Anonymizer
from rtanon.live import output as live_mod
from rtanon.live.config import LiveConfig
from rtanon.live.output import _OutputPath
from rtanon.live.recent import RecentValues
from rtanon.live.server import server_latency

RATE = 16000
CHUNK = 320  # 20 ms
BLOCK = 160  # 10 ms device callback


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(live_mod.time, "monotonic", c)
    return c


@pytest.fixture(scope="module")
def session():
    return Anonymizer().open_session(seed=0)


def _path(session, **cfg) -> _OutputPath:
    return _OutputPath(session, RATE, LiveConfig(**cfg))


def _ms(samples: int) -> float:
    return 1000.0 * samples / RATE


def _steady(path, clock, seconds, speech, chunk_value=0.1) -> list[float]:
    """Real-time pace: one chunk pushed per 20 ms, two 10 ms callbacks after it; returns what played."""
    played = []
    for _ in range(int(seconds * 50)):
        path.push(np.full(CHUNK, chunk_value, np.float32), speech=speech)
        for _ in range(2):
            clock.t += 0.010
            out = np.empty(BLOCK, np.float32)
            path.play(out, muted=False)
            played.append(out)
    return played


def test_a_burst_is_given_back_only_once_everything_queued_is_non_speech(session, clock):
    path = _path(session, jitter_ms=5)
    for _ in range(5):  # a 100 ms burst of speech (a worker that fell behind, then caught up)
        path.push(np.full(CHUNK, 0.1, np.float32), speech=True)
    burst = path.ring.readable
    _steady(path, clock, 3.0, speech=True)
    assert path.ring.readable >= burst - 2 * BLOCK  # speech keeps its extra delay: no word is cut
    _steady(path, clock, 3.0, speech=False)  # a pause: the extra is given back
    assert _ms(path.ring.readable) <= 5 + 20 + 1


def test_a_burst_is_given_back_in_pauses_shorter_than_the_queue(session, clock):
    """The soak's speech (utterances 0.5 s apart): after a SIGSTOP the queue kept 170 ms beyond its margin
    for good: the gate's pauses were shorter than the queue, which was never all non-speech."""
    path = _path(session, jitter_ms=5, window_s=1.0)
    played = _steady(path, clock, 2.0, speech=True)
    for _ in range(8):  # a 160 ms burst of speech
        path.push(np.full(CHUNK, 0.1, np.float32), speech=True)
    for _ in range(4):  # 1.5 s utterances, 0.1 s pauses, shorter than the queue (their output marked 0.02)
        played += _steady(path, clock, 1.5, speech=True)
        played += _steady(path, clock, 0.1, speech=False, chunk_value=0.02)
    assert _ms(path.ring.readable) <= 5 + 20 + 1  # given back
    rest = np.empty(path.ring.readable, np.float32)
    path.play(rest, muted=False)
    speech_pushed = (2.0 + 4 * 1.5) * 50 * CHUNK + 8 * CHUNK
    assert np.count_nonzero(np.concatenate(played + [rest]) == np.float32(0.1)) == speech_pushed  # none cut


def test_an_underflow_grows_the_margin_and_a_steady_path_shrinks_it_back(session, clock):
    cfg = dict(jitter_ms=5, max_jitter_ms=40, jitter_step_ms=2, steady_s=2.0)
    path = _path(session, **cfg)
    _steady(path, clock, 1.0, speech=False)
    base = path.margin
    assert _ms(base) == 5
    clock.t += 0.030  # the worker was 30 ms late: three callbacks find the queue short
    for _ in range(3):
        assert not path.play(np.empty(BLOCK, np.float32), muted=False)
    path.push(np.full(CHUNK, 0.1, np.float32), speech=False)
    grown = path.margin
    assert base < grown <= path._samples(40)
    _steady(path, clock, 2.5, speech=False)
    # after steady_s without an underflow: half the way back
    assert path.margin == grown - max(path._samples(2), (grown - base) // 2)
    _steady(path, clock, 60.0, speech=False)
    assert path.margin == base


def test_a_stalled_device_does_not_bank_late_audio(session, clock):
    path = _path(session, jitter_ms=5)
    _steady(path, clock, 0.5, speech=True)
    for _ in range(20):  # 400 ms of speech while the output device takes nothing
        clock.t += 0.020
        path.push(np.full(CHUNK, 0.1, np.float32), speech=True)
    assert _ms(path.ring.readable) <= 5 + 20  # the newest audio only: it plays in time when the device is back
    assert path.ring.readable > 0


def test_the_queue_never_plays_the_input_or_silence_when_it_runs_short(session, clock):
    path = _path(session, jitter_ms=0)
    path.push(np.full(CHUNK, 0.5, np.float32), speech=True)
    out = np.empty(3 * CHUNK, np.float32)
    assert not path.play(out, muted=False)
    assert np.all(out[:CHUNK] == 0.5)
    assert np.isfinite(out).all() and 0 < np.abs(out[CHUNK:]).max() < 0.05  # comfort noise after it


def test_recent_values_summarise_the_latest_or_those_since_a_mark():
    v = RecentValues(size=4)
    assert v.percentile(50) is None
    for x in (1.0, 2.0, 3.0):
        v.add(x)
    mark = v.count
    assert v.percentile(50, since=mark) is None
    for x in (10.0, 20.0, 30.0):
        v.add(x)
    assert v.percentile(50, since=mark) == 20.0
    assert v.percentile(0) == 3.0  # the array keeps the last four


def test_server_latency_is_asked_for_while_open_and_a_users_value_is_kept(monkeypatch):
    import os

    from rtanon.live.server import PIPEWIRE_PULSE_FLOORS

    floors = [f"PULSE_PROP_{key}" for key in PIPEWIRE_PULSE_FLOORS]
    for var in ["PULSE_LATENCY_MSEC", *floors]:
        monkeypatch.delenv(var, raising=False)
    with server_latency(15):
        assert os.environ["PULSE_LATENCY_MSEC"] == "15"
        assert [os.environ[var] for var in floors] == list(PIPEWIRE_PULSE_FLOORS.values())
    assert not {"PULSE_LATENCY_MSEC", *floors} & set(os.environ)
    with server_latency(0):
        assert not {"PULSE_LATENCY_MSEC", *floors} & set(os.environ)
    monkeypatch.setenv("PULSE_LATENCY_MSEC", "60")
    monkeypatch.setenv(floors[0], "1024/48000")
    with server_latency(15):
        assert os.environ["PULSE_LATENCY_MSEC"] == "60" and os.environ[floors[0]] == "1024/48000"
        assert os.environ[floors[1]] == PIPEWIRE_PULSE_FLOORS["pulse.min.frag"]
    assert os.environ["PULSE_LATENCY_MSEC"] == "60" and os.environ[floors[0]] == "1024/48000"
    assert floors[1] not in os.environ


def test_live_config_rejects_a_margin_beyond_its_maximum():
    from rtanon.config import ConfigError

    with pytest.raises(ConfigError, match="jitter_ms"):
        LiveConfig(jitter_ms=50, max_jitter_ms=40).validate()
    with pytest.raises(ConfigError, match="server_latency_ms"):
        LiveConfig(server_latency_ms=2).validate()
    with pytest.raises(ConfigError, match="out_block_ms"):
        LiveConfig(out_block_ms=1).validate()
    with pytest.raises(ConfigError, match="out_latency_ms"):
        LiveConfig(out_latency_ms=1).validate()
    LiveConfig().validate()


class _FakeStream:
    def __init__(self) -> None:
        self.active = True
        self.closed = False

    def abort(self) -> None:
        self.active = False

    def close(self) -> None:
        self.closed = True


def _watched_device(monkeypatch, clock):
    from rtanon.live.stream import DeviceStream

    dev = DeviceStream("output", "pulse", {"PULSE_SINK": "rtanon_sink"}, RATE, BLOCK, callback=None)
    opened = []

    def fake_open():
        dev.stream = _FakeStream()
        dev.opened_at = clock.t
        opened.append(dev.stream)

    monkeypatch.setattr(dev, "open", fake_open)
    dev.open()
    return dev, opened


def _watch_for(dev, clock, seconds: float, last_callback: float | None, step: float = 0.25) -> None:
    """run_live's device watch: every ``step`` s for ``seconds``; ``last_callback`` None: calling back
    all along (the last callback just now)."""
    for _ in range(round(seconds / step)):
        clock.t += step
        dev.watch(True, clock.t - 0.005 if last_callback is None else last_callback)


def test_a_stream_that_stopped_calling_back_is_reopened(monkeypatch, clock):
    """A 10-minute run on PulseAudio: after an underrun the ALSA pulse plug-in's output stream stayed
    'active' and never called back again; the virtual microphone fell silent for good. Under CPU overload
    (the soak) it hung so for 2.5 s at a time, until the old limit reopened it."""
    from rtanon.live.stream import DeviceStream

    dev, opened = _watched_device(monkeypatch, clock)
    first = dev.stream
    # fresh: PulseAudio may hold it up to 2 s after its first callback; that is no hang
    _watch_for(dev, clock, 2.0, last_callback=clock.t + 0.01)
    assert dev.stream is first and dev.stuck == 0
    _watch_for(dev, clock, 5.0, last_callback=None)  # then it flows
    last = clock.t
    _watch_for(dev, clock, DeviceStream.STALL_S, last)
    assert dev.stream is first and dev.stuck == 0
    _watch_for(dev, clock, 0.25, last)  # flowed, then nothing for more than STALL_S: hung
    assert first.closed and dev.stream is not first and dev.stuck == 1 and dev.reopens == 1
    _watch_for(dev, clock, 2.0, last)  # counted from the reopening, with the fresh stream's limit
    assert dev.stuck == 1 and len(opened) == 2
    _watch_for(dev, clock, 1.0, last)
    assert dev.stuck == 2 and len(opened) == 3
    _watch_for(dev, clock, 0.5, last_callback=None)  # the new one flows for half a second, then hangs
    last = clock.t
    _watch_for(dev, clock, 0.75, last)
    assert dev.stuck == 3 and len(opened) == 4  # STALL_S, not STUCK_S: it had flowed


def test_time_the_process_did_not_run_is_no_stall(monkeypatch, clock):
    """SIGSTOP or a starved process: the watch itself comes late; the stream gets STALL_S from then."""
    from rtanon.live.stream import DeviceStream

    dev, _ = _watched_device(monkeypatch, clock)
    first = dev.stream
    _watch_for(dev, clock, 5.0, last_callback=None)
    last = clock.t
    clock.t += 1.0  # stopped for a second: no callback and no watch
    dev.watch(True, last)
    assert dev.stream is first and dev.stuck == 0
    _watch_for(dev, clock, DeviceStream.STALL_S, last)
    assert dev.stream is first
    _watch_for(dev, clock, 0.25, last)
    assert dev.stuck == 1
