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
    """What one load-generator session saw: the round trip of every answered frame, the server's counters
    and, for the churn run, what it sent and got back (PCM16) and which session streamed beside it."""

    frames: int = 0
    round_trip_s: list[float] = field(default_factory=list)
    lost: int = 0  # frames sent and never answered (after a bye)
    abrupt: bool = False  # dropped the connection instead of saying bye
    server: dict = field(default_factory=dict)
    error: str = ""
    sent: np.ndarray | None = None
    got: np.ndarray | None = None
    source: int = 0  # which of the speech signals it streamed
    beside: int | None = None  # index of a session that streamed another signal at the same time

    @property
    def answered(self) -> int:
        return len(self.round_trip_s)

    @property
    def missed(self) -> int:
        return self.server.get("missed_deadlines", 0)


def stretch(audio: np.ndarray, first: int, n: int) -> np.ndarray:
    """``n`` frames of ``audio`` from frame ``first`` on, looping: ``(n, FRAME_SAMPLES)``."""
    total = len(audio) // FRAME_SAMPLES
    idx = (first + np.arange(n)) % total
    return audio[: total * FRAME_SAMPLES].reshape(total, FRAME_SAMPLES)[idx]


async def _stream(url: str, token: str, start: dict, frames: np.ndarray, phase_s: float, record: SessionRecord,
                  keep: bool = False) -> None:
    """One session: opens it, waits ``phase_s``, sends ``frames`` in real time, collects every answer and its
    round trip, then asks for the counters and says bye, or (``record.abrupt``) drops the connection."""
    record.frames = len(frames)
    out = np.zeros_like(frames) if keep else None
    sent: dict[int, float] = {}
    try:
        client = await ServeClient.open(url, token, start)
    except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
        record.error = str(exc) or type(exc).__name__
        return

    async def reader():
        while record.answered < len(frames):
            seq, y = await client.receive(timeout=10.0)
            record.round_trip_s.append(time.monotonic() - sent.pop(seq))
            if out is not None:
                out[seq] = y

    task = asyncio.create_task(reader())
    try:
        await asyncio.sleep(phase_s)
        t0 = time.monotonic()
        for i, frame in enumerate(frames):
            await asyncio.sleep(max(0.0, t0 + 0.02 * i - time.monotonic()))
            sent[i] = time.monotonic()
            await client.send(i, frame)
        if record.abrupt:
            await asyncio.sleep(0.1)
            await client.ws.close(code=4000)  # a client that drops mid-stream, no bye
        else:
            await asyncio.wait_for(task, timeout=10.0)
            record.server = await client.stats()
    except (ConnectionError, asyncio.TimeoutError) as exc:
        record.error = str(exc) or type(exc).__name__
    finally:
        task.cancel()
        record.lost = 0 if record.abrupt else len(sent)
        await client.close()
        if keep:
            record.sent = (frames.reshape(-1) * 32767).astype(np.int16)
            record.got = (out.reshape(-1) * 32767).astype(np.int16)


async def load_run(url: str, token: str, sessions: int, duration_s: float, speech: list[np.ndarray],
                   start: dict, seed: int = 0) -> list[SessionRecord]:
    """``sessions`` clients at once, each streaming a real utterance (looped) for ``duration_s`` in real
    time from a random phase within one frame and a random point of it; returns what each saw."""
    rng = np.random.default_rng(seed)
    n = int(round(duration_s / 0.02))
    records = [SessionRecord() for _ in range(sessions)]
    await asyncio.gather(*(
        _stream(url, token, start, stretch(audio := speech[i % len(speech)], int(rng.integers(len(audio) // 320)), n),
                float(rng.uniform(0, 0.02)), rec)
        for i, rec in enumerate(records)))
    return records


async def churn_run(url: str, token: str, concurrent: int, duration_s: float, speech: list[np.ndarray],
                    start: dict, seed: int = 0, life_s: tuple[float, float] = (2.0, 20.0),
                    abrupt_share: float = 0.3, on_progress=None) -> list[SessionRecord]:
    """``concurrent`` slots, each opening a session that lives a random ``life_s`` (streaming real speech from
    a random point), ending it (``abrupt_share`` of them by dropping the connection), and opening the next,
    until ``duration_s`` has passed. Each record notes a session that streamed another of the ``speech``
    signals beside it (:func:`churn_scores`)."""
    rng = np.random.default_rng(seed)
    records: list[SessionRecord] = []
    active: set[int] = set()
    t_end = time.monotonic() + duration_s

    async def slot() -> None:
        await asyncio.sleep(float(rng.uniform(0, 1.0)))
        while time.monotonic() < t_end:
            record = SessionRecord(abrupt=bool(rng.random() < abrupt_share), source=int(rng.integers(len(speech))))
            index = len(records)
            records.append(record)
            others = [i for i in sorted(active) if records[i].source != record.source]
            record.beside = others[int(rng.integers(len(others)))] if others else None
            active.add(index)
            life = min(float(rng.uniform(*life_s)), max(0.5, t_end - time.monotonic()))
            audio = speech[record.source]
            frames = stretch(audio, int(rng.integers(len(audio) // FRAME_SAMPLES)), max(1, int(life / 0.02)))
            try:
                await _stream(url, token, start, frames, 0.0, record, keep=True)
            finally:
                active.discard(index)
            if on_progress is not None:
                on_progress(records)

    await asyncio.gather(*(slot() for _ in range(concurrent)))
    return records


def churn_scores(records: list[SessionRecord], window_s: float = 0.5) -> list[tuple[float, float]]:
    """Per session: how much its output repeats its own input (:func:`rtanon.analysis.windowed_max_xcorr`), and
    how much any half-second of it repeats the input of the session beside it, at any offset (what must never
    leak from one session to another). A copy scores 1."""
    from rtanon.analysis import max_xcorr, windowed_max_xcorr

    scores = []
    for r in records:
        if r.got is None or r.sent is None:
            scores.append((0.0, 0.0))
            continue
        x, y = r.sent.astype(np.float32) / 32767, r.got.astype(np.float32) / 32767
        own = windowed_max_xcorr(x, y)
        cross = 0.0
        other = records[r.beside].sent if r.beside is not None else None
        if other is not None:
            xo, w = other.astype(np.float32) / 32767, int(window_s * 16000)
            for i in range(0, len(y) - w + 1, w):
                if np.sqrt(np.mean(y[i:i + w] ** 2)) > 0.01:
                    cross = max(cross, max_xcorr(y[i:i + w], xo))
        scores.append((own, cross))
    return scores
