"""rtanon.live.pulse_stream.PulseOutputStream on a private PulseAudio server: it plays what its callback writes,
goes on playing after underruns (the ALSA plug-in's stream restarts, and can hang, there), says when its
sink went away, and says why the server refused it."""

import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.pulse
if shutil.which("pulseaudio") is None or shutil.which("parec") is None:
    pytest.skip("needs pulseaudio and parec (apt-get install pulseaudio pulseaudio-utils)", allow_module_level=True)

RATE, BLOCK = 48000, 480


@pytest.fixture
def server(monkeypatch):
    from rtanon.live import pulse_stream
    from rtanon.live.pulse import PulseDaemon

    if not pulse_stream.available():
        pytest.skip("libpulse-simple is not installed (apt-get install libpulse0)")
    with PulseDaemon() as pd:
        for key, value in pd.env.items():  # libpulse finds the private server through these
            monkeypatch.setenv(key, value)
        pd.load_null_sink("out", RATE)
        yield pd


def _tone_callback(times, slow_every=0):
    phase = [0]

    def callback(out, frames, time_info, status):
        times.append((time.monotonic(), bool(status.output_underflow)))
        n = np.arange(phase[0], phase[0] + frames)
        out[:, 0] = 0.3 * np.sin(2 * np.pi * 440.0 * n / RATE)
        phase[0] += frames
        if slow_every and len(times) % slow_every == 0:
            time.sleep(0.08)  # longer than the server holds: an underrun
    return callback


def _wait_blocks(times, n, timeout_s=5.0) -> int:
    """Waits until the callback has run ``n`` times or ``timeout_s`` passed (a fresh stream on a sleeping
    null sink may wait 2 s to flow); how many times it ran."""
    deadline = time.monotonic() + timeout_s
    while len(times) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(times)


def test_plays_the_callbacks_audio_and_goes_on_after_underruns(server):
    from rtanon.live.pulse_stream import PulseOutputStream

    rec = subprocess.Popen(["parec", "--device=out.monitor", "--format=float32le", f"--rate={RATE}", "--channels=1",
                            "--latency-msec=20", "--raw"], env=server.env, stdout=subprocess.PIPE)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: rec.stdout.read(4800), b"")), daemon=True)
    reader.start()
    times = []
    stream = PulseOutputStream("out", RATE, BLOCK, _tone_callback(times, slow_every=40), latency_ms=15)
    stream.start()
    try:
        assert _wait_blocks(times, 50) >= 50, "the stream never flowed"
        t_flow = times[-1][0]
        time.sleep(4.0)
        assert stream.active and not stream.error
    finally:
        stream.abort()
        stream.close()
    rec.terminate()
    rec.wait(timeout=10)
    reader.join(timeout=5)
    after = np.array([t for t, _ in times if t >= t_flow])
    gaps = np.diff(after)
    # 80 ms stalls every 40 blocks: the stream comes back at once after each (no restart, no 2 s wait)
    assert gaps.max() < 0.3, gaps.max()
    assert after.shape[0] > 0.6 * 4.0 * RATE / BLOCK
    assert sum(u for t, u in times if t >= t_flow) >= 3  # the underruns are counted
    assert 0.0 < stream.latency < 0.2
    audio = np.frombuffer(b"".join(chunks), np.float32)
    spectrum = np.abs(np.fft.rfft(audio[-RATE:]))
    assert np.argmax(spectrum) == pytest.approx(440, abs=3)  # 1 s at 48 kHz: 1 Hz per bin


def test_a_server_that_goes_away_ends_the_stream_and_abort_returns_at_once(server):
    """(A sink that goes away moves its streams to the default sink: `DeviceStream.watch` closes the stream
    when the named sink is gone, as it does PortAudio's.)"""
    from rtanon.live.pulse_stream import PulseOutputStream

    times = []
    stream = PulseOutputStream("out", RATE, BLOCK, _tone_callback(times), latency_ms=15)
    stream.start()
    try:
        _wait_blocks(times, 20)
        server._proc.terminate()  # the sound server restarts, or dies
        deadline = time.monotonic() + 5.0
        while stream.active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stream.active and "ended" in stream.error
    finally:
        t0 = time.monotonic()
        stream.abort()
        stream.close()
        assert time.monotonic() - t0 < 0.5


def test_the_stream_asks_for_its_own_buffer_whatever_pulse_latency_msec_says(server, monkeypatch):
    from rtanon.live.pulse_stream import PulseOutputStream

    monkeypatch.setenv("PULSE_LATENCY_MSEC", "300")  # libpulse would put 300 ms in place of the 5 ms asked
    times = []
    stream = PulseOutputStream("out", RATE, BLOCK, _tone_callback(times), latency_ms=5)
    stream.start()
    try:
        assert _wait_blocks(times, 100) >= 100, "the stream never flowed"
        assert stream.latency < 0.1  # what the server reports it holds
    finally:
        stream.abort()
        stream.close()
    assert os.environ["PULSE_LATENCY_MSEC"] == "300"  # the other streams still read it


def test_a_refused_stream_says_why(server):
    from rtanon.live.pulse_stream import PulseOutputStream, PulseStreamError

    stream = PulseOutputStream("no_such_sink", RATE, BLOCK, _tone_callback([]), latency_ms=15)
    with pytest.raises(PulseStreamError, match="no_such_sink"):
        stream.start()
    assert not stream.active
