"""The WebSocket server of ``rtanon serve`` (aiohttp, the ``[serve]`` extra).

Routes: ``GET /ws`` (one WebSocket = one session, see :mod:`rtanon.serve.protocol`),
``GET /?token=TOKEN`` (a page that streams the browser's microphone to ``/ws`` and plays the anonymized
voice: ``static/``, plain HTML/JS, served under a strict Content-Security-Policy), ``GET /static/NAME``
(its script, audio worklet and style sheet; no secret in them, no token) and ``GET /health`` (``ok``, no
token: for load balancers). Every WebSocket request must carry the
server's token, as ``Authorization: Bearer TOKEN`` or (browsers cannot set headers) ``?token=TOKEN``;
a request with an ``Origin`` other than the server's own is refused (a page elsewhere cannot use a
visitor's token); beyond ``max_sessions`` a request is refused with 503. A session's client must
send ``start`` within ``START_TIMEOUT_S``, then frames no faster than real time (plus a burst);
one that breaks a rule is closed with the reason, in one logged line, and no one else notices.

:class:`ServeServer` holds the models (one ``Anonymizer`` per method and privacy point, loaded on
first use and shared by every session) and the :class:`rtanon.serve.scheduler.Scheduler`.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import sys
import time
from importlib import resources
from typing import TextIO

from aiohttp import WSCloseCode, WSMsgType, web

from rtanon.config import AnonymizerConfig, NeuralConfig
from rtanon.errors import UserError
from rtanon.paths import printable
from rtanon.serve.protocol import FRAME_BYTES, MAX_TEXT_BYTES, ProtocolError, pack_frame, parse_control, unpack_frame
from rtanon.serve.scheduler import Scheduler, ServeConfig, StreamSession

#: the page's files (``static/``) and their content types
STATIC_FILES = {"app.js": "text/javascript", "worklet.js": "text/javascript", "style.css": "text/css"}
#: a Host header that may go into the page's Content-Security-Policy (anything else: 'self' alone)
_PLAIN_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
_PAGE_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                 "X-Content-Type-Options": "nosniff", "Permissions-Policy": "microphone=(self)"}
START_TIMEOUT_S = 10.0
#: answers a client may leave unread before it is closed (it is not reading: 2 s of audio)
MAX_UNSENT_FRAMES = 100


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


def _static(name: str) -> str:
    return resources.files("rtanon.serve").joinpath("static", name).read_text(encoding="utf-8")


class ServeServer:
    """Models, scheduler and connections of one ``rtanon serve`` process."""

    def __init__(self, config: ServeConfig, token: str, *, base: AnonymizerConfig | None = None,
                 log: TextIO = sys.stderr) -> None:
        config.validate()
        self.config = config
        self.token = token
        self.base = base or AnonymizerConfig()
        self.log = log
        self.scheduler = Scheduler(config, self._on_output)
        self._anonymizers: dict[tuple[str, str], object] = {}
        self._model_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outboxes: dict[int, asyncio.Queue] = {}
        self._connections = 0
        self.refused = 0
        self.closed_reasons: list[str] = []  # the last reasons clients were closed with (for stats and tests)

    # -- models ---------------------------------------------------------------------------------
    def anonymizer_for(self, method: str, privacy: str):
        """The shared Anonymizer of a method and privacy point, built on first use (blocking)."""
        from dataclasses import replace

        from rtanon.engine import Anonymizer

        key = (method, privacy if method == "neural" else "")
        if key not in self._anonymizers:
            neural = replace(self.base.neural, privacy=privacy) if method == "neural" else self.base.neural
            anonymizer = Anonymizer(replace(self.base, method=method, neural=neural))
            warm_up(anonymizer)
            self._anonymizers[key] = anonymizer
        return self._anonymizers[key]

    async def _anonymizer(self, method: str, privacy: str):
        async with self._model_lock:  # one load at a time; later sessions find it built
            return await asyncio.get_running_loop().run_in_executor(None, self.anonymizer_for, method, privacy)

    # -- the scheduler's answers -> each connection's outbox ---------------------------------------
    def _on_output(self, outputs) -> None:
        packed = [(stream.id, pack_frame(seq, y)) for stream, seq, y in outputs]
        self._loop.call_soon_threadsafe(self._fan_out, packed)

    def _fan_out(self, packed) -> None:
        for sid, data in packed:
            box = self._outboxes.get(sid)
            if box is not None:
                box.put_nowait(data)

    # -- logging --------------------------------------------------------------------------------
    def _say(self, peer: str, what: str) -> None:
        print(f"rtanon serve: {peer}: {what}", file=self.log, flush=True)

    # -- requests -------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_TEXT_BYTES)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def _token_ok(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        given = auth[7:] if auth.startswith("Bearer ") else request.query.get("token", "")
        return secrets.compare_digest(given.encode(), self.token.encode())

    async def _page(self, request: web.Request) -> web.Response:
        """The microphone page; without the token a 401 that says how to open it."""
        if not self._token_ok(request):
            self.refused += 1
            self._say(printable(request.remote or "?", 60), "page refused: missing or wrong token")
            return web.Response(status=401, headers=_PAGE_HEADERS,
                                text="rtanon serve: missing or wrong token; open /?token=TOKEN with the token in "
                                     "the server's --token-file\n")
        host = request.host if _PLAIN_HOST.fullmatch(request.host or "") else None
        sockets = f" ws://{host} wss://{host}" if host else ""  # older browsers do not count ws: as 'self'
        csp = ("default-src 'none'; script-src 'self'; style-src 'self'; "
               f"connect-src 'self'{sockets}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
        return web.Response(text=_static("index.html"), content_type="text/html",
                            headers={**_PAGE_HEADERS, "Content-Security-Policy": csp})

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        return web.Response(text=_static(name), content_type=STATIC_FILES[name], headers=_PAGE_HEADERS)

    def _refusal(self, request: web.Request) -> web.Response | None:
        if not self._token_ok(request):
            return web.Response(status=401, text="rtanon serve: missing or wrong token\n")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            return web.Response(status=403, text="rtanon serve: connections from other sites' pages are refused\n")
        if self._connections >= self.config.max_sessions:
            return web.Response(status=503, text=f"rtanon serve: full ({self.config.max_sessions} sessions)\n")
        return None

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        peer = printable(request.remote or "?", 60)
        refusal = self._refusal(request)
        if refusal is not None:
            self.refused += 1
            self._say(peer, f"refused: {refusal.text.strip().removeprefix('rtanon serve: ')}")
            return refusal
        self._connections += 1
        try:
            return await self._session(request, peer)
        finally:
            self._connections -= 1

    async def _session(self, request: web.Request, peer: str) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_TEXT_BYTES, heartbeat=20.0)
        try:
            await ws.prepare(request)
        except ConnectionError:
            self._say(peer, "closed during the WebSocket handshake")
            return web.Response()
        stream = None
        reason = "the client left"
        sender = None
        try:
            stream = await self._start(ws)
            self._say(peer, f"session {stream.id} started ({stream.label})")
            box: asyncio.Queue = asyncio.Queue()
            self._outboxes[stream.id] = box
            sender = asyncio.create_task(self._send(ws, box))
            reason = await self._receive(ws, stream, box)
        except ProtocolError as exc:
            reason = str(exc)
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=reason[:120].encode())
        except UserError as exc:  # a bad identity, a model that cannot load
            reason = str(exc)
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=printable(reason, 120).encode())
        except asyncio.TimeoutError:
            reason = f"no start message within {START_TIMEOUT_S:.0f} s"
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=reason.encode())
        except ConnectionError:
            reason = "the connection broke"
        finally:
            if sender is not None:
                sender.cancel()
            if stream is not None:
                self.scheduler.remove(stream)
                self._outboxes.pop(stream.id, None)
            self.closed_reasons = (self.closed_reasons + [reason])[-100:]
            what = f"session {stream.id} closed" if stream is not None else "closed"
            self._say(peer, f"{what}: {printable(reason, 160)}")
        return ws

    async def _start(self, ws: web.WebSocketResponse) -> StreamSession:
        msg = await asyncio.wait_for(ws.receive(), START_TIMEOUT_S)
        if msg.type == WSMsgType.ERROR:  # e.g. over max_msg_size: aiohttp has closed it (1009)
            raise ProtocolError(printable(ws.exception(), 120))
        if msg.type != WSMsgType.TEXT:
            raise ProtocolError("the first message must be a JSON start message")
        start = parse_control(msg.data)
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
        anonymizer = await self._anonymizer(method, privacy)
        loop = asyncio.get_running_loop()
        session = await loop.run_in_executor(None, lambda: anonymizer.open_session(identity=identity))
        stream = StreamSession(session, f"{method}" + (f" {privacy}" if method == "neural" else ""))
        self.scheduler.add(stream)
        await ws.send_json({"type": "ready", "session": stream.id, "method": method,
                            "privacy": privacy if method == "neural" else None, "frame_samples": session.chunk_samples,
                            "sample_rate_hz": 16000, "frame_bytes": FRAME_BYTES,
                            "latency_ms": session.algorithmic_latency_samples / 16.0, "voice": session.voice})
        return stream

    async def _receive(self, ws: web.WebSocketResponse, stream: StreamSession, box: asyncio.Queue) -> str:
        """Reads the client until it leaves; returns why it ended (ProtocolError: it broke a rule)."""
        cfg = self.config
        frame_s = cfg.tick_ms / 1000.0
        budget, t_last = float(cfg.burst_frames), time.monotonic()
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                now = time.monotonic()  # token bucket: real time plus a burst
                budget = min(cfg.burst_frames, budget + (now - t_last) / frame_s)
                t_last = now
                if budget < 1.0:
                    raise ProtocolError("frames arrive faster than real time (flooding)")
                budget -= 1.0
                seq, samples = unpack_frame(msg.data)
                if box.qsize() > MAX_UNSENT_FRAMES:
                    raise ProtocolError("the client does not read its answers")
                self.scheduler.push(stream, seq, samples)
            elif msg.type == WSMsgType.TEXT:
                message = parse_control(msg.data)
                kind = message["type"]
                if kind == "start":
                    raise ProtocolError("start was already sent")
                if kind == "bye":
                    await ws.close(code=WSCloseCode.OK, message=b"bye")
                    return "bye"
                if kind == "mute":
                    stream.muted = message["on"]
                elif kind == "stats":
                    await ws.send_json({"type": "stats", **stream.stats(), "server": self.server_stats()})
                elif kind == "new_voice":
                    old = stream.session
                    new = await asyncio.get_running_loop().run_in_executor(
                        None, lambda: old.anonymizer.open_session(unlike=old))
                    stream.next_session = new
            elif msg.type == WSMsgType.ERROR:
                return f"connection error ({printable(ws.exception(), 80)})"
        if ws.close_code not in (None, WSCloseCode.OK, 1001):
            return f"the client closed with code {ws.close_code}"
        return "the client left"

    async def _send(self, ws: web.WebSocketResponse, box: asyncio.Queue) -> None:
        while True:
            data = await box.get()
            try:
                await ws.send_bytes(data)
            except ConnectionError:
                return

    def server_stats(self) -> dict:
        return {"sessions": len(self.scheduler), "refused": self.refused, **self.scheduler.stats.summary(),
                "batched_calls": {k: dict(v) for k, v in self.scheduler.calls.items()}}

    # -- life cycle -----------------------------------------------------------------------------
    async def run(self, host: str, port: int, ssl_context=None, ready=None) -> None:
        """Serves until cancelled; ``ready(port)`` is called once listening (port 0: the OS picks one)."""
        self._loop = asyncio.get_running_loop()
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]
        self.scheduler.start()
        try:
            if ready is not None:
                ready(bound)
            await asyncio.Event().wait()
        finally:
            self.scheduler.stop()
            await runner.cleanup()
