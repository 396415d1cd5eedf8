"""Clients of ``rtanon serve``: one session (:class:`ServeClient`) and the load generator of
``rtanon bench --serve`` (:func:`load_run`: N sessions of real speech, paced in real time).

Both speak :mod:`rtanon.serve.protocol` over aiohttp's WebSocket client.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np

from rtanon.constants import FRAME_SAMPLES
from rtanon.serve.protocol import pack_frame, unpack_frame


class ServeRefused(ConnectionError):
    """The server refused or closed the session; the message says why."""


class ServeClient:
    """One session: ``await ServeClient.open(url, token, start={...})``, then ``send``/``receive``."""

    def __init__(self, http, ws, ready: dict) -> None:
        self._http, self.ws, self.ready = http, ws, ready
        self.texts: list[dict] = []  # control answers (stats) received while reading frames

    @classmethod
    async def open(cls, url: str, token: str, start: dict | None = None, **connect) -> "ServeClient":
        import aiohttp

        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=1 << 20,
                                       **connect)
            await ws.send_str(json.dumps({"type": "start", **(start or {})}))
            msg = await ws.receive(timeout=60.0)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ServeRefused(f"no ready message (closed: {ws.close_code} {msg.extra or ''})")
            return cls(http, ws, json.loads(msg.data))
        except aiohttp.WSServerHandshakeError as exc:
            await http.close()
            raise ServeRefused(f"refused: HTTP {exc.status}") from None
        except BaseException:
            await http.close()
            raise

    async def send(self, seq: int, audio: np.ndarray) -> None:
        await self.ws.send_bytes(pack_frame(seq, audio))

    async def receive(self, timeout: float = 5.0) -> tuple[int, np.ndarray]:
        """The next answered frame ``(seq, float32 samples)``; control answers are kept in ``texts``."""
        import aiohttp

        while True:
            msg = await self.ws.receive(timeout=timeout)
            if msg.type == aiohttp.WSMsgType.BINARY:
                return unpack_frame(msg.data)
            if msg.type == aiohttp.WSMsgType.TEXT:
                self.texts.append(json.loads(msg.data))
                continue
            raise ServeRefused(f"closed ({self.ws.close_code}: {msg.extra or ''})")

    async def control(self, message: dict) -> None:
        await self.ws.send_str(json.dumps(message))

    async def stats(self, timeout: float = 10.0) -> dict:
        """Asks for the session's and server's counters; frames that arrive meanwhile are dropped."""
        import aiohttp

        await self.control({"type": "stats"})
        while True:
            msg = await self.ws.receive(timeout=timeout)
            if msg.type == aiohttp.WSMsgType.TEXT and (answer := json.loads(msg.data)).get("type") == "stats":
                return answer
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                raise ServeRefused(f"closed ({self.ws.close_code}: {msg.extra or ''})")

    async def close(self) -> None:
        try:
            if not self.ws.closed:
                await self.control({"type": "bye"})
                await self.ws.close()
        finally:
            await self._http.close()


@dataclass
class SessionRecord:
    """What one load-generator session saw: the round trip of every answered frame and the server's counters."""

    round_trip_s: list[float] = field(default_factory=list)
    lost: int = 0  # frames sent and never answered
    server: dict = field(default_factory=dict)
    error: str = ""


async def _one_session(url: str, token: str, start: dict, audio: np.ndarray, duration_s: float, phase_s: float,
                       offset: int, record: SessionRecord) -> None:
    n_frames = int(round(duration_s * 1000 / 20))
    sent: dict[int, float] = {}
    try:
        client = await ServeClient.open(url, token, start)
    except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
        record.error = str(exc) or type(exc).__name__
        return

    async def reader():
        while len(record.round_trip_s) < n_frames:
            seq, _ = await client.receive(timeout=10.0)
            record.round_trip_s.append(time.monotonic() - sent.pop(seq))

    task = asyncio.create_task(reader())
    try:
        await asyncio.sleep(phase_s)
        t0 = time.monotonic()
        frames = len(audio) // FRAME_SAMPLES
        for i in range(n_frames):
            delay = t0 + i * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            k = (i + offset) % frames
            sent[i] = time.monotonic()
            await client.send(i, audio[k * FRAME_SAMPLES:(k + 1) * FRAME_SAMPLES])
        await asyncio.wait_for(task, timeout=10.0)
        record.server = await client.stats()
    except (ConnectionError, asyncio.TimeoutError) as exc:
        record.error = str(exc) or type(exc).__name__
    finally:
        task.cancel()
        record.lost = len(sent)
        await client.close()


async def load_run(url: str, token: str, sessions: int, duration_s: float, speech: list[np.ndarray],
                   start: dict, seed: int = 0) -> list[SessionRecord]:
    """``sessions`` clients at once, each streaming a real utterance (looped) for ``duration_s`` in real
    time from a random phase within one frame and a random point of it; returns what each saw."""
    rng = np.random.default_rng(seed)
    records = [SessionRecord() for _ in range(sessions)]
    await asyncio.gather(*(
        _one_session(url, token, start, audio := speech[i % len(speech)], duration_s, float(rng.uniform(0, 0.02)),
                     int(rng.integers(len(audio) // FRAME_SAMPLES)), rec)
        for i, rec in enumerate(records)))
    return records
