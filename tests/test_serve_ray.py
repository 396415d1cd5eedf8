"""``rtanon serve --ray-address local --replicas 2``: sessions spread over two Ray Serve replicas, each
pinned to its replica; a replica's death ends only its own sessions, and new ones go on."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("aiohttp")

from rtanon.serve.client import ServeClient  # noqa: E402

TOKEN = "ray-test-token-" + "y" * 20
#: where this process imports rtanon from (the source tree, or the installed package with its built extension):
#: the children import the same one
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__import__("rtanon").__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_replicas_share_sessions_and_a_dead_replica_ends_only_its_own(tmp_path, speech):
    (tmp_path / "token").write_text(TOKEN)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rtanon", "serve", "--ray-address", "local", "--replicas", "2",
         "--cpus-per-replica", "0.5", "--method", "mcadams", "--port", str(port), "--token-file",
         str(tmp_path / "token")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))})
    try:
        t_end = time.monotonic() + 180
        for line in proc.stderr:
            if "listening on" in line or time.monotonic() > t_end:
                break
        assert "listening on" in line, line
        url = f"ws://127.0.0.1:{port}/ws"
        x = speech[: 320 * 50].reshape(50, 320)

        async def talk(client: ServeClient, frames: np.ndarray, first_seq: int = 0) -> int:
            """Sends the frames in real time; returns how many came back."""
            got = 0
            try:
                for i, f in enumerate(frames):
                    await client.send(first_seq + i, f)
                    await asyncio.sleep(0.02)
                while got < len(frames):
                    await client.receive(timeout=5)
                    got += 1
            except (ConnectionError, asyncio.TimeoutError):  # ServeRefused too: the replica's close
                pass
            return got

        async def main():
            clients = [await ServeClient.open(url, TOKEN, {"method": "mcadams"}) for _ in range(6)]
            hosts = [c.ready["host"] for c in clients]
            answered = await asyncio.gather(*(talk(c, x) for c in clients))
            victim_pid = int(hosts[0].split("/")[1])
            os.kill(victim_pid, signal.SIGKILL)  # the replica of the first session dies
            after = await asyncio.gather(*(talk(c, x[:25], 50) for c in clients))
            late = await ServeClient.open(url, TOKEN, {"method": "mcadams"})  # a new session goes on
            late_answered = await talk(late, x[:25])
            for c in clients + [late]:
                try:
                    await c.close()
                except ConnectionError:  # the dead replica's
                    await c._http.close()
            return hosts, answered, after, late_answered

        hosts, answered, after, late_answered = asyncio.run(main())
        assert len(set(hosts)) == 2, hosts  # the router used both replicas
        assert answered == [50] * 6
        for host, n in zip(hosts, after):
            assert n == (0 if host == hosts[0] else 25), (hosts, after)  # only the dead replica's sessions ended
        assert late_answered == 25
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
