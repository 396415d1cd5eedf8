"""Sessions over any WebSocket: :class:`SessionHost` runs the protocol of one connection at a time
(:mod:`rtanon.serve.protocol`) against a small :class:`Connection` interface, over the shared models
and the :class:`rtanon.serve.scheduler.Scheduler`. Two fronts adapt it: aiohttp
(:mod:`rtanon.serve.server`, one process) and Starlette inside a Ray Serve replica
(:mod:`rtanon.serve.ray_serve`, many machines). Both check a request the same way (:meth:`refusal`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from typing import Any, Protocol, TextIO

from rtanon.config import AnonymizerConfig
from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.errors import UserError
from rtanon.paths import printable
from rtanon.serve.protocol import FRAME_BYTES, ProtocolError, pack_frame, parse_control, unpack_frame
from rtanon.serve.scheduler import Scheduler, ServeConfig, StreamSession

START_TIMEOUT_S = 10.0
#: answers a client may leave unread before it is closed (it is not reading: 2 s of audio)
MAX_UNSENT_FRAMES = 100
#: control messages (mute, new_voice, stats) a client may send in a burst, and a second after it
CONTROL_BURST, CONTROL_PER_S = 20, 5.0
#: how often the event loop's own stalls are measured (:meth:`SessionHost.stalled`)
STALL_PROBE_S = 0.01
#: a wake-up later than this counts as a stall
STALL_MIN_S = 0.005
#: WebSocket close codes
CLOSE_OK, CLOSE_POLICY = 1000, 1008
#: the longest close reason a WebSocket close frame carries, in UTF-8 bytes
MAX_CLOSE_REASON_BYTES = 123


def close_reason(reason: str, limit: int = MAX_CLOSE_REASON_BYTES) -> bytes:
    """``reason`` in UTF-8, cut to ``limit`` bytes at a character boundary (a cut character would make the
    client read the close as 1007, invalid data, and lose the reason)."""
    return reason.encode("utf-8")[:limit].decode("utf-8", "ignore").encode("utf-8")


def _all(headers, name: str) -> list[str]:
    """Every value of a header (aiohttp's ``getall``, Starlette's ``getlist``)."""
    get = getattr(headers, "getall", None)
    return list(get(name, [])) if get is not None else list(headers.getlist(name))


class Connection(Protocol):
    """One accepted WebSocket, as the host sees it."""

    async def receive(self) -> tuple[str, Any]:
        """The next message: ``("text", str)``, ``("bytes", bytes)``, ``("closed", code)`` or ``("error", why)``."""
        ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_text(self, text: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


def warm_up(anonymizer, sessions: int = 3, frames: int = 10) -> None:
    """Steps a few throwaway sessions batched, so that the first real tick does not build the batched
    graphs or compile kernels."""
    import numpy as np

    from rtanon.batch import run_batched

    rng = np.random.default_rng(0)
    streams = [anonymizer.open_session(seed=i) for i in range(sessions)]
    for _ in range(frames):
        chunks = [(0.05 * rng.standard_normal(anonymizer.chunk_samples)).astype(np.float32) for _ in streams]
        run_batched([s.steps(x) for s, x in zip(streams, chunks)])


class SessionHost:
    """Models (one ``Anonymizer`` per method and privacy point, built on first use and shared), the
    scheduler, and the sessions of the connections it serves. ``name`` tells clients which host (a Ray
    Serve replica) serves them."""

    def __init__(self, config: ServeConfig, token: str, *, base: AnonymizerConfig | None = None,
                 log: TextIO = sys.stderr, name: str = "") -> None:
        config.validate()
        self.config = config
        self.token = token
        self.base = base or AnonymizerConfig()
        self.log = log
        self.name = name
        self.scheduler = Scheduler(config, self._on_output)
        self._anonymizers: dict[tuple[str, str], object] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outboxes: dict[int, asyncio.Queue] = {}
        self._probe: asyncio.Handle | None = None
        self._probe_due = 0.0  # when the probe asked to run: the loop is counted as held up past it
        self.stalled_s = 0.0  # how long the event loop has been held up in all (a slow call, SIGSTOP)
        self.connections = 0
        self.refused = 0

    # -- models ---------------------------------------------------------------------------------
    def anonymizer_for(self, method: str, privacy: str):
        """The shared Anonymizer of a method and privacy point, built and warmed on first use (blocking)."""
        from dataclasses import replace

        from rtanon.engine import Anonymizer

        key = (method, privacy if method == "neural" else "")
        if key not in self._anonymizers:
            neural = replace(self.base.neural, privacy=privacy) if method == "neural" else self.base.neural
            anonymizer = Anonymizer(replace(self.base, method=method, neural=neural))
            anonymizer.check_streams()
            warm_up(anonymizer)
            self._anonymizers[key] = anonymizer
        return self._anonymizers[key]

    def loaded(self, method: str, privacy: str):
        """The Anonymizer of a method and privacy point loaded before serving; a session asks only for
        these (a load takes seconds of the GIL, and every other session's frames would be late meanwhile)."""
        key = (method, privacy if method == "neural" else "")
        if key not in self._anonymizers:
            serves = ", ".join(" ".join(filter(None, k)) for k in self._anonymizers) or "nothing yet"
            raise ProtocolError(f"this server has not loaded {' '.join(filter(None, key))} (it serves {serves}; "
                                "its --method and --privacy choose)")
        return self._anonymizers[key]

    # -- the event loop's own stalls --------------------------------------------------------------
    def stalled(self, now: float) -> float:
        """How long the event loop has been held up in all (a slow call, SIGSTOP), counted up to ``now``:
        time in which a client's frames waited at the server, not at the client, so the flood check does
        not count it against the client. A probe asks to run every ``STALL_PROBE_S``; the loop is held up
        for as long as the probe is overdue. Whoever reads the count first after a stall (the probe, or a
        session's task reading the frames the stall held back) counts it, so the order in which the loop
        runs them does not matter."""
        if now - self._probe_due > STALL_MIN_S:  # a wake-up's usual jitter is not a stall
            self.stalled_s += now - self._probe_due
            self._probe_due = now  # counted up to here
        return self.stalled_s

    def _probe_stalls(self) -> None:
        now = self._loop.time()
        self.stalled(now)
        self._probe_due = now + STALL_PROBE_S
        self._probe = self._loop.call_at(self._probe_due, self._probe_stalls)

    # -- the scheduler's answers -> each connection's outbox ---------------------------------------
    def _on_output(self, outputs) -> None:
        packed = [(stream.id, pack_frame(seq, y)) for stream, seq, y in outputs]
        self._loop.call_soon_threadsafe(self._fan_out, packed)

    def _fan_out(self, packed) -> None:
        for sid, data in packed:
            box = self._outboxes.get(sid)
            if box is not None:
                box.put_nowait(data)

    # -- requests -------------------------------------------------------------------------------
    def say(self, peer: str, what: str) -> None:
        print(f"rtanon serve: {peer}: {what}", file=self.log, flush=True)

    def token_ok(self, headers, query) -> bool:
        """Whether a request carries the server's token (``Authorization: Bearer`` or ``?token=``)."""
        auth = headers.get("Authorization", "")
        given = auth[7:] if auth.startswith("Bearer ") else query.get("token", "")
        return secrets.compare_digest(given.encode(), self.token.encode())

    def refusal(self, headers, query, origin_self: str) -> tuple[int, str] | None:
        """Why a WebSocket request must be refused, as ``(HTTP status, reason)``, or None: no or a wrong
        token (``Authorization: Bearer`` or ``?token=``), an ``Origin`` other than ``origin_self`` or more
        than one, a full host."""
        if not self.token_ok(headers, query):
            return 401, "missing or wrong token"
        origins = _all(headers, "Origin")
        if len(origins) > 1:
            return 403, "more than one Origin header"
        if origins and origins[0] != origin_self:
            return 403, "connections from other sites' pages are refused"
        if self.connections >= self.config.max_sessions:
            return 503, f"full ({self.config.max_sessions} sessions)"
        return None

    async def serve(self, conn: Connection, peer: str) -> None:
        """Runs one accepted connection's session to its end; logs one line when it ends."""
        self._loop = asyncio.get_running_loop()
        if self._probe is None:
            self._probe_due = self._loop.time()
            self._probe = self._loop.call_soon(self._probe_stalls)
        self.connections += 1
        stream, sender, reason = None, None, "the client left"
        try:
            stream = await self._start(conn)
            self.say(peer, f"session {stream.id} started ({stream.label})")
            box: asyncio.Queue = asyncio.Queue()
            self._outboxes[stream.id] = box
            sender = asyncio.create_task(self._send(conn, box))
            reason = await self._receive(conn, stream, box)
        except (ProtocolError, UserError) as exc:  # a broken rule; a bad identity
            reason = str(exc)
            await conn.close(CLOSE_POLICY, printable(reason, MAX_CLOSE_REASON_BYTES))
        except asyncio.TimeoutError:
            reason = f"no start message within {START_TIMEOUT_S:.0f} s"
            await conn.close(CLOSE_POLICY, reason)
        except ConnectionError:
            reason = "the connection broke"
        finally:
            self.connections -= 1
            if sender is not None:
                sender.cancel()
            if stream is not None:
                self.scheduler.remove(stream)
                self._outboxes.pop(stream.id, None)
            what = f"session {stream.id} closed" if stream is not None else "closed"
            self.say(peer, f"{what}: {printable(reason, 160)}")

    async def _start(self, conn: Connection) -> StreamSession:
        kind, data = await asyncio.wait_for(conn.receive(), START_TIMEOUT_S)
        if kind == "error":  # e.g. over the size limit: the front has closed it
            raise ProtocolError(printable(data, 120))
        if kind != "text":
            raise ProtocolError("the first message must be a JSON start message")
        start = parse_control(data)
        if start["type"] != "start":
            raise ProtocolError("the first message must be a start message")
        method = start.get("method", self.base.method)
        privacy = start.get("privacy", self.base.neural.privacy)
        identity = None
        if "identity" in start:
            from rtanon.identity.speaker import PseudoSpeaker

            if method != "neural":
                raise ProtocolError("start.identity is for the neural method")
            identity = PseudoSpeaker.from_json(start["identity"], "start.identity")
        anonymizer = self.loaded(method, privacy)
        loop = asyncio.get_running_loop()
        session = await loop.run_in_executor(None, lambda: anonymizer.open_session(identity=identity))
        stream = StreamSession(session, f"{method}" + (f" {privacy}" if method == "neural" else ""))
        self.scheduler.add(stream)
        await conn.send_text(json.dumps({
            "type": "ready", "session": stream.id, "host": self.name, "method": method,
            "privacy": privacy if method == "neural" else None, "frame_samples": session.chunk_samples,
            "sample_rate_hz": SAMPLE_RATE_HZ, "frame_bytes": FRAME_BYTES,
            "latency_ms": session.algorithmic_latency_samples * 1000 / SAMPLE_RATE_HZ, "voice": session.voice}))
        return stream

    async def _receive(self, conn: Connection, stream: StreamSession, box: asyncio.Queue) -> str:
        """Reads the client until it leaves; returns why it ended (ProtocolError: it broke a rule).

        Flooding is judged on the client's own clock: a token bucket of one frame per 20 ms and a burst,
        whose cap grows by the time the event loop here was held up since the client's last frame (a frame
        sent in real time that waited in the socket while this server stalled arrives in a burst with the
        others, through no fault of the client). Control messages have a bucket of their own."""
        cfg = self.config
        frame_s = cfg.tick_ms / 1000.0
        t_last = self._loop.time()
        budget, stalled_last = float(cfg.burst_frames), self.stalled(t_last)
        control, t_control = float(CONTROL_BURST), t_last
        while True:
            kind, data = await conn.receive()
            if kind == "bytes":
                now = self._loop.time()
                stalled = self.stalled(now)
                cap = cfg.burst_frames + (stalled - stalled_last) / frame_s
                budget = min(budget + (now - t_last) / frame_s, max(cap, budget))
                t_last, stalled_last = now, stalled
                if budget < 1.0:
                    raise ProtocolError("frames arrive faster than real time (flooding)")
                budget -= 1.0
                seq, samples = unpack_frame(data)
                if box.qsize() > MAX_UNSENT_FRAMES:
                    raise ProtocolError("the client does not read its answers")
                self.scheduler.push(stream, seq, samples)
            elif kind == "text":
                now = self._loop.time()
                control = min(float(CONTROL_BURST), control + (now - t_control) * CONTROL_PER_S)
                t_control = now
                if control < 1.0:
                    raise ProtocolError(f"control messages faster than {CONTROL_PER_S:.0f} a second")
                control -= 1.0
                message = parse_control(data)
                if message["type"] == "start":
                    raise ProtocolError("start was already sent")
                if message["type"] == "bye":
                    await conn.close(CLOSE_OK, "bye")
                    return "bye"
                if message["type"] == "mute":
                    stream.muted = message["on"]
                elif message["type"] == "stats":
                    await conn.send_text(json.dumps({"type": "stats", **stream.stats(), "server": self.stats()}))
                elif message["type"] == "new_voice":
                    old = stream.session
                    stream.next_session = await asyncio.get_running_loop().run_in_executor(
                        None, lambda: old.anonymizer.open_session(unlike=old))
            elif kind == "error":
                return f"connection error ({printable(data, 80)})"
            else:
                return "the client left" if data in (None, CLOSE_OK, 1001) else f"the client closed with code {data}"

    async def _send(self, conn: Connection, box: asyncio.Queue) -> None:
        while True:
            data = await box.get()
            try:
                await conn.send_bytes(data)
            except (ConnectionError, RuntimeError):  # closed under us (Starlette raises RuntimeError)
                return

    def stats(self) -> dict:
        return {"host": self.name, "sessions": len(self.scheduler), "refused": self.refused,
                **self.scheduler.stats.summary(),
                "batched_calls": {k: dict(v) for k, v in self.scheduler.calls.items()}}
