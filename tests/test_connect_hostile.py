"""``rtanon connect`` against servers that are not ``rtanon serve``: it trusts them with nothing it can check.

Each server here is a few lines of aiohttp in the test's own thread: a generic echo server, one that sends a
well-formed ready and then the user's own frames back (as they came, at half volume, sign-flipped and shifted,
several frames late), one that floods, one that closes right after its ready, one whose frames have the wrong
size, and ones whose ready message is wrong. The client must never play the user's voice, keep its memory
bounded, back off between reconnections, and say in one line what is wrong."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from aiohttp import WSMsgType, web  # noqa: E402

from rtanon.eval.signal import windowed_max_xcorr as raw_voice_score  # noqa: E402
from rtanon.io.audio import read_audio  # noqa: E402
from rtanon.live.core import LiveCore  # noqa: E402
from rtanon.serve.protocol import pack_frame, unpack_frame  # noqa: E402
from rtanon.serve.remote import ECHO_MEMORY_FRAMES, EchoCheck, RemoteConfig, RemoteSession  # noqa: E402
from test_serve import TOKEN  # noqa: E402
from test_serve_clients import RATE, drive, rtanon_connect  # noqa: E402

#: what a real server's ready message holds (rtanon.serve.host)
READY = {"type": "ready", "session": 7, "host": "h", "method": "mcadams", "privacy": None, "frame_samples": 320,
         "sample_rate_hz": 16000, "frame_bytes": 644, "latency_ms": 30.0, "voice": {"method": "mcadams"}}


class Hostile:
    """A WebSocket server at ``/ws`` on a loopback port, in its own thread and event loop: ``handler(ws)``
    speaks to each connection; ``connections`` holds when each one came (time.monotonic)."""

    def __init__(self, handler, host: str = "127.0.0.1") -> None:
        self.connections: list[float] = []
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        async def route(request):
            ws = web.WebSocketResponse(max_msg_size=1 << 20)
            await ws.prepare(request)
            self.connections.append(time.monotonic())
            try:
                await handler(ws)
            except (ConnectionError, RuntimeError):  # the client went away mid-flood
                pass
            return ws

        async def serve():
            app = web.Application()
            app.router.add_get("/ws", route)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, host, 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            started.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self.loop)
        assert started.wait(10)
        self.url = f"ws://{'[' + host + ']' if ':' in host else host}:{self.port}/ws"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def hostile():
    servers = []

    def start(handler, host="127.0.0.1"):
        servers.append(Hostile(handler, host))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


async def echo(ws):
    """The generic echo server of the issue: every text and binary message answered with itself."""
    async for msg in ws:
        if msg.type == WSMsgType.TEXT:
            await ws.send_str(msg.data)
        elif msg.type == WSMsgType.BINARY:
            await ws.send_bytes(msg.data)


def ready_then(answer, ready=READY):
    """A server that reads the start, sends ``ready``, then answers frame ``seq`` with ``answer(seq, history)``
    (``history``: the frames received so far, by sequence number)."""

    async def handler(ws):
        await ws.receive()
        await ws.send_str(json.dumps(ready))
        history: dict[int, np.ndarray] = {}
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                seq, x = unpack_frame(msg.data)
                history[seq] = x
                await ws.send_bytes(pack_frame(seq, answer(seq, history)))

    return handler


def shifted(seq, history, by=100):
    """The user's audio ``by`` samples late, sign-flipped at 0.3: no frame boundary, no sign, no level kept."""
    frames = [history.get(s, np.zeros(320, np.float32)) for s in (seq - 1, seq)]
    return -0.3 * np.concatenate(frames)[320 - by:640 - by]


ECHOES = {
    "the frame itself": lambda seq, h: h[seq],
    "at half volume": lambda seq, h: 0.5 * h[seq],
    "7 frames late": lambda seq, h: h.get(seq - 7, np.zeros(320, np.float32)),
    "shifted 100 samples, -0.3": shifted,
}


@pytest.fixture(scope="module")
def speech(speech_paths) -> np.ndarray:
    return np.concatenate([read_audio(p) for p in speech_paths[:2]])[: 4 * RATE]


# -- 1. the user's voice sent back --------------------------------------------------------------------------

def test_a_generic_echo_server_is_no_session(hostile, tmp_path):
    """The echoed start is not a ready message: one line, exit 2, and nothing is opened or played."""
    server = hostile(echo)
    (tmp_path / "token").write_text(TOKEN + "\n")
    r = rtanon_connect("--server", server.url, "--token-file", str(tmp_path / "token"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "not an rtanon serve session: its first message is not a ready message" in lines[0], lines[0]
    assert "'start'" in lines[0]


@pytest.mark.parametrize("kind", list(ECHOES))
def test_an_answer_that_is_the_users_frame_is_never_played(hostile, speech, kind):
    server = hostile(ready_then(ECHOES[kind]))
    remote = RemoteSession(server.url, TOKEN, {"method": "mcadams"}).open()
    try:
        y = drive(LiveCore(remote, RATE, RATE), speech)
    finally:
        remote.close()
    score = raw_voice_score(speech[: len(y)], y, max_lag_s=0.5)
    print(f"\n{kind}: played output vs input {score:.3f}, RMS {np.sqrt(np.mean(y**2)):.5f}; "
          f"{getattr(remote, 'failed', '')}")
    assert score < 0.3  # before the fix: 0.999
    assert np.sqrt(np.mean(y**2)) < 10 ** (-60 / 20)  # comfort noise (-66 dBFS) throughout: no voice
    assert "sent back your own voice" in remote.failed and "session ended" in remote.failed, remote.failed
    assert "FAILED" in remote.status()
    assert len(server.connections) == 1 and remote.reconnects == 0  # a session that failed does not come back


def test_connect_exits_1_when_the_server_sends_the_voice_back(hostile, speech, tmp_path, monkeypatch, capsys):
    """The command's wiring: the live loop stops once the session failed, and `rtanon connect` exits 1 with
    the reason (the live loop on the test's fake device clock instead of sound devices)."""
    import rtanon.commands._common
    import rtanon.live.devices
    import rtanon.live.loop
    from rtanon.cli import main

    server = hostile(ready_then(ECHOES["at half volume"]))
    (tmp_path / "token").write_text(TOKEN + "\n")
    stops = []

    def fake_run_live(session, *args, stop_when=None, **kwargs):
        core = LiveCore(session, RATE, RATE)
        drive(core, speech[: 2 * RATE])
        stops.append(stop_when())
        return core

    monkeypatch.setattr(rtanon.commands._common, "import_sounddevice", lambda: None)
    monkeypatch.setattr(rtanon.live.devices, "resolve_device", lambda spec, kind: (None, {}))
    monkeypatch.setattr(rtanon.live.loop, "run_live", fake_run_live)
    code = main(["connect", "--server", server.url, "--token-file", str(tmp_path / "token"), "--quiet",
                 "--pipeline-ms", "200"])  # room for a loaded machine: the answers must come back to be checked
    err = capsys.readouterr().err
    assert code == 1 and stops == [True], err
    assert "rtanon connect: error: the server at" in err and "sent back your own voice" in err


def test_real_anonymized_output_passes_the_echo_check_and_copies_do_not(speech_paths):
    """The check against what the neural method and McAdams (at alpha 0.95, the mildest allowed) give on real
    speech, PCM16 both ways as on the wire: no answer flagged; every copy of the input above -70 dBFS is."""
    from rtanon import Anonymizer
    from rtanon.config import AnonymizerConfig, McAdamsConfig

    anonymizer = Anonymizer(AnonymizerConfig(method="mcadams", mcadams=McAdamsConfig(alpha_min=0.95, alpha_max=0.95)))
    lag = RemoteConfig().pipeline_frames
    for path in speech_paths[:2]:
        x = read_audio(path)
        frames = x[: len(x) // 320 * 320].reshape(-1, 320)
        session = anonymizer.open_session(seed=3)
        wire = [np.round(np.clip(session.process(f), -1, 1) * 32767) / 32768 for f in frames]
        check, copies = EchoCheck(lag + ECHO_MEMORY_FRAMES), EchoCheck(lag + ECHO_MEMORY_FRAMES)
        for i in range(len(frames)):
            check.push(frames[i])
            copies.push(frames[i])
            if i < lag:
                continue
            assert check.echo(wire[i - lag].astype(np.float32)) is None, i
            sent_back = (np.round(-0.4 * frames[i - lag] * 32767) / 32768).astype(np.float32)
            if np.sqrt(np.mean(sent_back**2)) > 10 ** (-70 / 20):
                assert copies.echo(sent_back) is not None, i


# -- 4. a server that floods ---------------------------------------------------------------------------------

async def flood_texts(ws):
    await ws.receive()
    await ws.send_str(json.dumps(READY))
    pad = json.dumps({"type": "stats", "pad": "x" * 60_000})
    while not ws.closed:
        await ws.send_str(pad)


async def flood_frames(ws):
    await ws.receive()
    await ws.send_str(json.dumps(READY))
    silence = np.zeros(320, np.float32)
    seq = 0
    while not ws.closed:
        await ws.send_bytes(pack_frame(seq, silence))
        seq += 1
        if seq % 64 == 0:
            await asyncio.sleep(0)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def pace(remote: RemoteSession, seconds: float) -> None:
    """Silence through ``remote.process`` in real time, for ``seconds``."""
    t0 = time.monotonic()
    for i in range(int(seconds / 0.02)):
        remote.process(np.zeros(320, np.float32))
        time.sleep(max(0.0, t0 + 0.02 * (i + 1) - time.monotonic()))


@pytest.mark.parametrize("handler,says", [(flood_texts, "floods: over 20 text messages unasked"),
                                          (flood_frames, "floods: ")])
def test_a_flooding_server_is_dropped_and_memory_stays_bounded(hostile, handler, says):
    server = hostile(handler)
    before = rss_mb()
    remote = RemoteSession(server.url, TOKEN, {"method": "mcadams"}).open()
    try:
        pace(remote, 4.0)
        grown = rss_mb() - before
        status = remote.status()
    finally:
        remote.close()
    print(f"\n{handler.__name__}: {remote.last_error}; {len(server.connections)} connections in 4 s; "
          f"RSS +{grown:.0f} MB; status {status!r}")
    assert says in remote.last_error, remote.last_error
    assert grown < 60  # before the fix: every 60 kB text kept, hundreds of MB in seconds
    assert 2 <= len(server.connections) <= 6  # dropped, and retried with a growing pause


# -- 5. reconnect storms ---------------------------------------------------------------------------------------

async def close_after_ready(ws):
    await ws.receive()
    await ws.send_str(json.dumps(READY))
    await ws.close()


async def bad_frames(ws):
    await ws.receive()
    await ws.send_str(json.dumps(READY))
    async for msg in ws:
        if msg.type == WSMsgType.BINARY:
            await ws.send_bytes(msg.data[:270])


@pytest.mark.parametrize("handler,says", [(close_after_ready, "the server closed the session"),
                                          (bad_frames, "a frame of 270 bytes (a frame is 644)")])
def test_a_server_that_keeps_dropping_the_session_is_retried_with_back_off(hostile, handler, says):
    server = hostile(handler)
    remote = RemoteSession(server.url, TOKEN, {"method": "mcadams"}).open()
    statuses = []
    try:
        for _ in range(6):
            pace(remote, 1.0)
            statuses.append(remote.status())
    finally:
        remote.close()
    gaps = np.diff(server.connections)
    print(f"\n{handler.__name__}: {len(server.connections)} connections in 6 s, gaps {np.round(gaps, 2)}; "
          f"{statuses[-1]!r}")
    assert says in remote.last_error, remote.last_error
    assert 3 <= len(server.connections) <= 8  # before the fix: thousands (a loaded machine only slows it down)
    assert gaps[-1] >= 0.8  # the pause grew (from 0.1-0.2 s)
    assert any("retry" in s and "back-off up to 5 s" in s and says[:20] in s for s in statuses), statuses


def test_closing_while_connected_keeps_the_last_error():
    """The first connection breaks the protocol, the second holds; closing then is no error of the server's,
    so the session still tells what went wrong last (the status line and the stop's summary read it)."""
    seen = []

    async def breaks_once(ws):
        seen.append(len(seen))
        await ws.receive()
        await ws.send_str(json.dumps(READY))
        async for msg in ws:
            if msg.type == WSMsgType.BINARY and len(seen) == 1:
                await ws.send_bytes(msg.data[:270])

    server = Hostile(breaks_once)
    remote = RemoteSession(server.url, TOKEN, {"method": "mcadams"}).open()
    try:
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end and not (len(seen) == 2 and remote.connected):
            pace(remote, 0.1)
        assert len(seen) == 2 and remote.connected
    finally:
        remote.close()
        server.stop()
    assert "a frame of 270 bytes" in remote.last_error, remote.last_error


# -- 6. bad ready messages ------------------------------------------------------------------------------------

def say_then_wait(text: str):
    async def handler(ws):
        await ws.receive()
        await ws.send_str(text)
        await ws.receive()

    return handler


def ready_with(**fields) -> str:
    return json.dumps({**READY, **fields})


@pytest.mark.parametrize("text,says", [
    ("[]", "its first message is a JSON list, not an object"),
    ("not json", "its first message is not JSON"),
    (ready_with(latency_ms="abc"), 'has latency_ms "abc", not a number of milliseconds from 0 to 2000'),
    (ready_with(latency_ms=float("nan")), "its first message is not JSON (NaN is not a JSON number)"),
    (ready_with(latency_ms=1e300), "has latency_ms 1e+300, not a number of milliseconds"),
    (ready_with(method="neural", privacy="balanced"), "has method \"neural\", not the method asked for (mcadams)"),
    (ready_with(frame_samples=160), "has frame_samples 160, not 320"),
    (ready_with(voice="x" * 5000), "has voice"),
    (ready_with(session=None), "has session null, not a session id"),
])
def test_a_bad_ready_message_exits_2_saying_what_is_wrong(hostile, tmp_path, text, says):
    server = hostile(say_then_wait(text))
    (tmp_path / "token").write_text(TOKEN + "\n")
    r = rtanon_connect("--server", server.url, "--token-file", str(tmp_path / "token"), "--method", "mcadams")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"rtanon connect: error: {server.url}: not an rtanon serve session: "), lines[0]
    assert says in lines[0] and "rtanon devices" not in lines[0] and len(lines[0]) < 400, lines[0]


def test_a_reconnection_to_a_server_whose_ready_turned_bad_backs_off(hostile):
    state = {"n": 0}

    async def handler(ws):
        state["n"] += 1
        await ws.receive()
        if state["n"] > 1:
            await ws.send_str("[]")
            return
        await ws.send_str(json.dumps(READY))
        await asyncio.sleep(0.3)
        await ws.close()

    server = hostile(handler)
    remote = RemoteSession(server.url, TOKEN, {"method": "mcadams"}).open()
    try:
        pace(remote, 3.0)
    finally:
        remote.close()
    assert "not an rtanon serve session" in remote.last_error and remote.reconnects == 0
    assert 2 <= len(server.connections) <= 6


# -- 10. what the URL may hold --------------------------------------------------------------------------------

def test_server_url_takes_an_ipv6_address_as_serve_prints_it():
    from rtanon.commands.connect import server_url
    from rtanon.errors import CliError

    assert server_url("ws://::1:8765/ws") == server_url("ws://[::1]:8765/ws") == "ws://[::1]:8765/ws"
    assert server_url("wss://fe80::1%eth0:9000") == "wss://[fe80::1%eth0]:9000/ws"
    for wrong, says in (("ws://::1/ws", "in brackets"), ("ws://a:b:c/ws", "in brackets"),
                        ("ws://user:pass@127.0.0.1:8765/ws", "no user name or password"),
                        ("ws://token@127.0.0.1:8765", "no user name or password")):
        with pytest.raises(CliError, match=says):
            server_url(wrong)


def test_connect_reaches_a_server_on_ipv6_loopback_by_the_url_serve_printed(hostile):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    from rtanon.commands.connect import server_url

    server = hostile(ready_then(lambda seq, h: np.zeros(320, np.float32)), host="::1")
    remote = RemoteSession(server_url(f"ws://::1:{server.port}/ws"), TOKEN, {"method": "mcadams"}).open()
    remote.close()
    assert remote.ready["session"] == 7


def test_credentials_in_the_url_are_refused_in_one_line(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    r = rtanon_connect("--server", "ws://user:pass@127.0.0.1:9/ws", "--token-file", str(tmp_path / "token"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "no user name or password in the URL" in lines[0], r.stderr
    assert "--token-file" in lines[0] and "closed the session" not in lines[0]
