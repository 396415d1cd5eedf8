"""Clients of ``rtanon serve``: one session (:class:`ServeClient`) and the load generator of
``rtanon bench --serve`` (:func:`load_run`: N sessions of real speech, paced in real time).

Both speak :mod:`rtanon.serve.protocol` over aiohttp's WebSocket client.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from dataclasses import dataclass, field

import numpy as np

from rtanon.constants import FRAME_SAMPLES, SAMPLE_RATE_HZ
from rtanon.serve.protocol import FRAME_BYTES, MAX_TEXT_BYTES, pack_frame, unpack_frame


class ServeRefused(ConnectionError):
    """The server refused or closed the session, or broke the protocol; the message says why."""


class ServerBroke(ServeRefused):
    """The server broke the protocol (a frame of another size, a text that is not a JSON object, a flood): it
    is dropped without a bye."""


class BadReady(ServeRefused):
    """The server's first message is not a ready message for the session asked for: not rtanon serve."""


#: the most text messages a server may send unasked: a burst, then one a second (the server sends none
#: unasked; it answers ``stats``); a server past it floods and is dropped
TEXT_BURST = 20
TEXT_PER_S = 1.0
#: the longest ``voice`` description a ready message may carry (JSON characters; the server's is ~200)
VOICE_CHARS_MAX = 2048
#: the largest algorithmic latency a ready message may state (ms; the neural method's is ~100)
LATENCY_MS_MAX = 2000.0


class _NotJsonNumber(ValueError):
    pass


def _no_constant(name: str):
    """``json.loads``' ``parse_constant``: Python's json reads NaN and Infinity, which JSON has not."""
    raise _NotJsonNumber(f"{name} is not a JSON number")


def check_ready(text: str, start: dict) -> dict:
    """The server's first message (``text``, a WebSocket text message) as the ready message of the session
    ``start`` asked for, every field checked; raises :class:`BadReady` saying what is wrong."""
    from rtanon.config import METHOD_NAMES, PRIVACY_POINTS
    from rtanon.paths import printable

    def wrong(what: str) -> BadReady:
        return BadReady(f"not an rtanon serve session: its first message {what} (is --server an `rtanon serve` "
                        "server of this version?)")

    try:
        ready = json.loads(text, parse_constant=_no_constant)
    except _NotJsonNumber as exc:
        raise wrong(f"is not JSON ({exc})") from None
    except (ValueError, RecursionError):
        raise wrong("is not JSON") from None
    if not isinstance(ready, dict):
        raise wrong(f"is a JSON {type(ready).__name__.replace('dict', 'object')}, not an object")
    if ready.get("type") != "ready":
        raise wrong(f"is not a ready message (its type is {printable(repr(ready.get('type')), 30)})")

    def field(name: str, ok, says: str):
        value = ready.get(name)
        if not ok(value):
            raise wrong(f"has {name} {printable(json.dumps(value), 40)}, not {says}")
        return value

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    field("session", lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
          or (isinstance(v, str) and 0 < len(v) <= 64), "a session id (a number, or a string of 1 to 64 characters)")
    method = field("method", lambda v: v in METHOD_NAMES and v == start.get("method", v),
                   f"the method asked for ({start['method']})" if "method" in start else
                   f"one of {', '.join(METHOD_NAMES)}")
    if method == "neural":
        field("privacy", lambda v: v in PRIVACY_POINTS and v == start.get("privacy", v),
              f"the privacy point asked for ({start['privacy']})" if "privacy" in start else
              f"one of {', '.join(PRIVACY_POINTS)}")
    for name, value in (("frame_samples", FRAME_SAMPLES), ("sample_rate_hz", SAMPLE_RATE_HZ),
                        ("frame_bytes", FRAME_BYTES)):
        field(name, lambda v, value=value: number(v) and v == value, f"{value}")
    field("latency_ms", lambda v: number(v) and 0.0 <= v <= LATENCY_MS_MAX,
          f"a number of milliseconds from 0 to {LATENCY_MS_MAX:.0f}")
    field("voice", lambda v: isinstance(v, dict) and len(json.dumps(v)) <= VOICE_CHARS_MAX,
          f"a JSON object of at most {VOICE_CHARS_MAX} characters")
    return ready


class ServeClient:
    """One session: ``await ServeClient.open(url, token, start={...})``, then ``send``/``receive``."""

    def __init__(self, http, ws, ready: dict) -> None:
        self._http, self.ws, self.ready = http, ws, ready
        self.texts: collections.deque[dict] = collections.deque(maxlen=TEXT_BURST)  # the last control answers
        self._text_budget, self._text_t = float(TEXT_BURST), time.monotonic()

    @classmethod
    async def open(cls, url: str, token: str, start: dict | None = None, **connect) -> "ServeClient":
        """Connects, sends ``start`` and waits for the server's ready message (:func:`check_ready`)."""
        import aiohttp

        start = start or {}
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=MAX_TEXT_BYTES,
                                       **connect)
            await ws.send_str(json.dumps({"type": "start", **start}))
            msg = await ws.receive(timeout=60.0)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ServeRefused(f"the server closed the session before it was ready ({_closed(ws, msg)})")
            return cls(http, ws, check_ready(msg.data, start))
        except aiohttp.WSServerHandshakeError as exc:
            await http.close()
            raise ServeRefused(f"refused: HTTP {exc.status}") from None
        except BaseException:
            await http.close()
            raise

    async def send(self, seq: int, audio: np.ndarray) -> None:
        await self.ws.send_bytes(pack_frame(seq, audio))

    async def receive(self, timeout: float = 5.0) -> tuple[int, np.ndarray]:
        """The next answered frame ``(seq, float32 samples)``; the last control answers are kept in ``texts``.
        Raises :class:`ServeRefused` when the connection ends, :class:`ServerBroke` when the server breaks the
        protocol (a frame of another size, a text that is not a JSON object, texts faster than ``TEXT_PER_S``
        after a burst of ``TEXT_BURST``)."""
        import aiohttp

        from rtanon.paths import printable

        while True:
            msg = await self.ws.receive(timeout=timeout)
            if msg.type == aiohttp.WSMsgType.BINARY:
                if len(msg.data) != FRAME_BYTES:
                    raise ServerBroke(f"the server broke the protocol: a frame of {len(msg.data)} bytes (a frame is "
                                      f"{FRAME_BYTES})")
                return unpack_frame(msg.data)
            if msg.type == aiohttp.WSMsgType.ERROR:  # a message over MAX_TEXT_BYTES, a broken frame
                raise ServerBroke(f"the server broke the protocol: {printable(msg.extra, 80)}")
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ServeRefused(f"the server closed the session ({_closed(self.ws, msg)})")
            now = time.monotonic()
            self._text_budget = min(float(TEXT_BURST), self._text_budget + (now - self._text_t) * TEXT_PER_S)
            self._text_t = now
            if self._text_budget < 1.0:
                raise ServerBroke(f"the server floods: over {TEXT_BURST} text messages unasked (or {TEXT_PER_S:.0f} "
                                  "a second)")
            self._text_budget -= 1.0
            try:
                text = json.loads(msg.data, parse_constant=_no_constant)
            except (ValueError, RecursionError):
                text = None
            if not isinstance(text, dict):
                raise ServerBroke("the server broke the protocol: a text message that is not a JSON object")
            self.texts.append(text)

    async def control(self, message: dict) -> None:
        await self.ws.send_str(json.dumps(message))

    async def stats(self, timeout: float = 10.0) -> dict:
        """Asks for the session's and server's counters; frames that arrive meanwhile are dropped."""
        import aiohttp

        await self.control({"type": "stats"})
        while True:
            msg = await self.ws.receive(timeout=timeout)
            if msg.type == aiohttp.WSMsgType.TEXT:
                answer = json.loads(msg.data, parse_constant=_no_constant)
                if isinstance(answer, dict) and answer.get("type") == "stats":
                    return answer
            elif msg.type != aiohttp.WSMsgType.BINARY:
                raise ServeRefused(f"the server closed the session ({_closed(self.ws, msg)})")

    async def close(self, polite: bool = True) -> None:
        """Says bye and closes; ``polite=False`` drops the connection at once (a server that broke the protocol
        gets no bye, and its flood no wait for its close)."""
        try:
            if polite and not self.ws.closed:
                await self.control({"type": "bye"})
                await self.ws.close()
        finally:
            await self._http.close()


def _closed(ws, msg) -> str:
    """How a connection ended, for a message: the close code and the server's reason, made printable."""
    from rtanon.paths import printable

    reason = printable(msg.extra or "", 80)  # a close's reason, or the error aiohttp raised (a message too big)
    return f"code {ws.close_code}" + (f": {reason}" if reason else "")


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
    """Per session: how much its output repeats its own input (:func:`rtanon.eval.signal.windowed_max_xcorr`), and
    how much any half-second of it repeats the input of the session beside it, at any offset (what must never
    leak from one session to another). A copy scores 1."""
    from rtanon.eval.signal import max_xcorr, windowed_max_xcorr

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


async def hostile_run(url: str, token: str, duration_s: float, start: dict, held_sockets: int = 12) -> dict:
    """Bad clients beside a churn run until ``duration_s`` has passed, one after another: ``held_sockets``
    TCP connections that never send a request (half of them trickling a header byte a second), kept at that
    number as the server closes them; and in turn a session that sends 300 ``stats`` at once, a start for a
    method the server has not loaded, and a WebSocket request with another site's Host. Returns what each
    got: ``{attack: {"tried": n, "refused": n}}`` (refused: closed or answered as the server's rules say)."""
    import aiohttp
    from urllib.parse import urlsplit

    where = urlsplit(url)
    host, port = where.hostname, where.port
    tally = {k: {"tried": 0, "refused": 0} for k in ("idle_socket", "stats_flood", "unloaded_method", "rebind_host")}
    t_end = time.monotonic() + duration_s
    other = {"method": "neural" if start.get("method") == "mcadams" else "mcadams"}

    async def idle(trickle: bool) -> None:
        while time.monotonic() < t_end:
            tally["idle_socket"]["tried"] += 1
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(1.0)
                continue
            closed = False
            try:
                for _ in range(15):  # past the server's handshake timeout
                    if trickle:
                        writer.write(b"G")
                    try:
                        await asyncio.wait_for(reader.read(1), 1.0)  # b"" (closed) or an answer (400): dealt with
                        closed = True
                        break
                    except asyncio.TimeoutError:
                        continue
            except OSError:  # reset
                closed = True
            finally:
                writer.close()
            tally["idle_socket"]["refused"] += closed
            await asyncio.sleep(0.2)

    async def sessions() -> None:
        auth = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < t_end:
                tally["stats_flood"]["tried"] += 1
                try:
                    ws = await http.ws_connect(url, headers=auth)
                    await ws.send_str(json.dumps({"type": "start", **start}))
                    for _ in range(300):
                        await ws.send_str(json.dumps({"type": "stats"}))
                    while (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
                        pass
                    tally["stats_flood"]["refused"] += ws.close_code == 1008
                    tally["unloaded_method"]["tried"] += 1
                    ws = await http.ws_connect(url, headers=auth)
                    await ws.send_str(json.dumps({"type": "start", **other}))
                    await ws.receive(timeout=10)
                    tally["unloaded_method"]["refused"] += ws.close_code == 1008
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                tally["rebind_host"]["tried"] += 1
                try:
                    await http.ws_connect(url, headers={**auth, "Host": f"evil.example:{port}"})
                except aiohttp.WSServerHandshakeError as exc:
                    tally["rebind_host"]["refused"] += exc.status == 403
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(3.0)

    await asyncio.gather(*(idle(i % 2 == 1) for i in range(held_sockets)), sessions())
    return tally
