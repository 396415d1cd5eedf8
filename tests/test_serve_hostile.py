"""``rtanon serve`` against clients that hold its descriptors, stall its loop or fake its Host: the server
in a child process (a low descriptor limit, its own log), an honest real-time session beside each attack
that must be answered in full and never closed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiohttp")

import rtanon  # noqa: E402
from rtanon.serve.client import ServeClient, ServeRefused  # noqa: E402

SRC = str(Path(rtanon.__file__).resolve().parents[1])  # the child runs the rtanon this test imports
TOKEN = "hostile-test-token-" + "y" * 20
FD_LIMIT = 256
HANDSHAKE_S = 2.0

_SERVER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
import rtanon.serve.server as server
server.HANDSHAKE_TIMEOUT_S = {handshake}
from rtanon.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Child:
    """``rtanon serve --method mcadams`` in a child process whose descriptors are capped at ``FD_LIMIT``."""

    def __init__(self, tmp: Path) -> None:
        (tmp / "token").write_text(TOKEN + "\n")
        (tmp / "token").chmod(0o600)
        self.log_path = tmp / "serve.log"
        self._log = open(self.log_path, "w")
        code = _SERVER.format(limit=FD_LIMIT, handshake=HANDSHAKE_S)
        env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", "0", "--method", "mcadams",
                                      "--max-sessions", "8", "--workers", "1", "--token-file", str(tmp / "token")],
                                     stderr=self._log, stdout=subprocess.DEVNULL, env=env)
        t_end = time.monotonic() + 120
        while time.monotonic() < t_end and "listening on" not in self.log():
            assert self.proc.poll() is None, self.log()
            time.sleep(0.1)
        line = next(line for line in self.log().splitlines() if "listening on" in line)
        self.port = int(line.split("ws://127.0.0.1:")[1].split("/")[0])
        self.url = f"ws://127.0.0.1:{self.port}/ws"

    def log(self) -> str:
        return self.log_path.read_text()

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    server = Child(tmp_path_factory.mktemp("serve"))
    yield server
    server.stop()


async def honest(url: str, seconds: float, during=None) -> dict:
    """A real-time session of ``seconds`` (a tone in 20 ms frames, paced on its own clock) while
    ``during()`` runs beside it; what it saw."""
    client = await ServeClient.open(url, TOKEN, {"method": "mcadams"})
    n = int(seconds / 0.02)
    t = np.arange(320, dtype=np.float32) / 16000
    got: set[int] = set()

    async def reader():
        while len(got) < n:
            seq, _ = await client.receive(timeout=20)
            got.add(seq)

    task = asyncio.create_task(reader())
    side = asyncio.create_task(during()) if during is not None else None
    t0 = time.monotonic()
    error = ""
    try:
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + 0.02 * i - time.monotonic()))
            await client.send(i, (0.3 * np.sin(2 * np.pi * 180 * (t + 0.02 * i))).astype(np.float32))
        await asyncio.wait_for(task, 30)
        stats = await client.stats()
    except (ServeRefused, ConnectionError, asyncio.TimeoutError) as exc:
        error, stats = str(exc) or type(exc).__name__, {}
    finally:
        task.cancel()
        await client.close()
    side_result = await side if side is not None else None
    return {"answered": len(got), "sent": n, "error": error, "stats": stats, "side": side_result}


def test_idle_and_trickling_sockets_under_a_low_descriptor_limit_starve_nothing(child):
    """More idle sockets than the server's descriptor limit, and sockets trickling headers: the running session
    goes on, a new one opens, every such socket is closed within the handshake timeout, no traceback."""
    fds0 = child.fds()
    before = len(child.log().splitlines())

    async def attack():
        loop = asyncio.get_running_loop()
        idle, trickle = [], []
        for i in range(FD_LIMIT + 150):
            s = socket.socket()
            s.setblocking(False)
            try:
                await loop.sock_connect(s, ("127.0.0.1", child.port))
            except OSError:
                s.close()
                continue
            (trickle if i % 8 == 0 else idle).append(s)
        for _ in range(8):  # a header byte a quarter second for two seconds
            for s in trickle:
                try:
                    s.send(b"G")
                except OSError:
                    pass
            await asyncio.sleep(0.25)
        late = await ServeClient.open(child.url, TOKEN, {"method": "mcadams"})  # a new session opens meanwhile
        ready = late.ready["type"]
        await late.close()
        await asyncio.sleep(HANDSHAKE_S + 1.0)
        closed = 0
        for s in idle + trickle:
            try:
                s.recv(1)  # b"": closed; a 400 to a broken request line
                closed += 1
            except BlockingIOError:  # still open
                pass
            except OSError:  # reset
                closed += 1
            s.close()
        return ready, closed, len(idle) + len(trickle)


    result = asyncio.run(honest(child.url, 8.0, attack))
    ready, closed, opened = result["side"]
    assert result["error"] == "" and result["answered"] == result["sent"], result
    assert ready == "ready"
    assert opened > FD_LIMIT and closed == opened  # every one of them closed by the server
    time.sleep(0.5)
    assert child.fds() <= fds0 + 1
    log = child.log()
    assert "Traceback" not in log
    assert len(log.splitlines()) - before < 60  # a line per refusal, rate-limited: not one per socket


def test_a_server_stopped_for_seconds_does_not_close_its_clients_as_flooding(child):
    """SIGSTOP for 3 s: the real-time client's frames wait in the socket and arrive in one burst; it sent them
    in real time, so it is not flooding."""

    async def stop_and_go():
        await asyncio.sleep(1.0)
        os.kill(child.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(3.0)
        os.kill(child.proc.pid, signal.SIGCONT)

    result = asyncio.run(honest(child.url, 7.0, stop_and_go))
    assert result["error"] == "" and result["answered"] == result["sent"], (result, child.log()[-2000:])
    assert "flooding" not in child.log()


def test_a_stats_flood_and_an_unloaded_method_leave_a_session_beside_untouched(child):
    async def flood():
        await asyncio.sleep(0.5)
        import aiohttp

        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(child.url, headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send_str(json.dumps({"type": "start", "method": "mcadams"}))
            await ws.receive(timeout=10)
            for _ in range(1000):
                await ws.send_str(json.dumps({"type": "stats"}))
            while (msg := await ws.receive(timeout=15)).type not in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                pass
            flooded = (ws.close_code, msg.extra)
            ws = await http.ws_connect(child.url, headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send_str(json.dumps({"type": "start", "method": "neural"}))
            msg = await ws.receive(timeout=15)
            return flooded, (ws.close_code, msg.extra)

    result = asyncio.run(honest(child.url, 6.0, flood))
    (code, reason), (code2, reason2) = result["side"]
    assert code == 1008 and "control messages faster than" in reason
    assert code2 == 1008 and "has not loaded neural balanced" in reason2 and "serves mcadams" in reason2
    assert result["error"] == "" and result["answered"] == result["sent"], result


def _handshake(port: int, headers: list[tuple[str, str]]) -> int:
    """The HTTP status of a raw WebSocket upgrade request with exactly these headers (duplicates kept)."""
    lines = ["GET /ws HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", f"Authorization: Bearer {TOKEN}",
             *(f"{k}: {v}" for k, v in headers)]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(s.recv(100).split()[1])


def test_a_rebinding_host_and_two_origins_are_refused(child):
    p = child.port
    evil = f"evil.example:{p}"
    assert _handshake(p, [("Host", evil), ("Origin", f"http://{evil}")]) == 403
    assert _handshake(p, [("Host", evil)]) == 403
    assert _handshake(p, [("Host", f"127.0.0.1:{p}"), ("Origin", f"http://127.0.0.1:{p}"),
                          ("Origin", "http://evil.example")]) == 403
    assert _handshake(p, [("Host", f"127.0.0.1:{p}"), ("Origin", f"http://127.0.0.1:{p}")]) == 101
    assert _handshake(p, [("Host", f"localhost:{p}")]) == 101
    assert "unexpected Host 'evil.example:" in child.log() and "more than one Origin header" in child.log()


def test_a_long_close_reason_is_cut_at_a_character_boundary(child):
    import aiohttp

    async def main():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(child.url, headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send_str(json.dumps({"type": "start", "method": "mcadams", "\u20ac" * 40: 1}))
            msg = await ws.receive(timeout=10)
            return ws.close_code, msg.extra

    code, reason = asyncio.run(main())
    assert code == 1008 and reason.startswith("start: unknown field '\u20ac")
    assert len(reason.encode()) <= 123


def test_over_long_headers_log_one_line_and_no_traceback(child):
    before = len(child.log().splitlines())
    with socket.create_connection(("127.0.0.1", child.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n")
        status = int(s.recv(100).split()[1])
    time.sleep(0.3)
    assert status in (400, 431)
    assert "Traceback" not in child.log() and len(child.log().splitlines()) - before <= 2


def _rtanon_serve(*args: str, tmp: Path, until: str | None = None) -> tuple[int | None, str]:
    """``rtanon serve ARGS`` in a child: its exit status and stderr, or (None, stderr up to ``until``) once it
    has printed ``until`` (then it is stopped)."""
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rtanon", "serve", *args], stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp)
    try:
        if until is None:
            return proc.wait(60), proc.stderr.read()
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if until in line:
                return None, "".join(lines)
        return proc.wait(10), "".join(lines)
    finally:
        proc.kill()
        proc.wait()


def test_serve_prints_an_ipv6_address_in_brackets_and_refuses_a_directory_as_token_file(tmp_path):
    code, err = _rtanon_serve("--token-file", str(tmp_path), tmp=tmp_path)
    assert code == 2 and "is a directory" in err and len(err.strip().splitlines()) == 1, err
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    code, err = _rtanon_serve("--host", "::1", "--port", "0", "--method", "mcadams", "--token-file",
                              str(tmp_path / "t"), tmp=tmp_path, until="listening on")
    assert code is None and "listening on ws://[::1]:" in err and "the page: http://[::1]:" in err, err
