"""The WebSocket server of ``rtanon serve`` on one machine (aiohttp, the ``[serve]`` extra).

Routes: ``GET /ws`` (one WebSocket = one session, see :mod:`rtanon.serve.protocol`),
``GET /?token=TOKEN`` (a page that streams the browser's microphone to ``/ws`` and plays the anonymized
voice: ``static/``, plain HTML/JS, served under a strict Content-Security-Policy), ``GET /static/NAME``
(its script, audio worklet and style sheet; no secret in them, no token) and ``GET /health`` (``ok``, no
token: for load balancers). Every WebSocket request must carry the
server's token, as ``Authorization: Bearer TOKEN`` or (browsers cannot set headers) ``?token=TOKEN``
(401 otherwise); a request whose ``Host`` is not an address the server listens on (DNS rebinding), or
with an ``Origin`` other than the server's own or more than one, is refused (403: a page elsewhere
cannot use a visitor's token); beyond ``max_sessions``, 503. What a session does is
:class:`rtanon.serve.host.SessionHost`'s; this module adapts aiohttp to it.

Before it shows the token a connection holds a descriptor for nothing, so :class:`_Gate` bounds them:
each must be authenticated (its WebSocket or page request checked) within ``HANDSHAKE_TIMEOUT_S`` of
its TCP accept, headers trickled in included, and past ``MAX_PENDING_PER_ADDRESS`` from one address or
the pending cap in all (below the descriptor limit) the oldest is closed. Refusals and the event loop's
and aiohttp's errors are logged one line each, at most ``LOG_LINES_PER_S`` a second, never a traceback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import time
from importlib import resources

from aiohttp import WSCloseCode, WSMsgType, web

from rtanon.paths import printable
from rtanon.serve.host import SessionHost, close_reason
from rtanon.serve.protocol import MAX_TEXT_BYTES

#: the page's files (``static/``) and their content types
STATIC_FILES = {"app.js": "text/javascript", "worklet.js": "text/javascript", "style.css": "text/css"}
#: a Host header that may go into the page's Content-Security-Policy (anything else: 'self' alone)
_PLAIN_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
_PAGE_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                 "X-Content-Type-Options": "nosniff", "Permissions-Policy": "microphone=(self)"}


#: how long a connection may take from its TCP accept to a checked token (TLS and headers included)
HANDSHAKE_TIMEOUT_S = 10.0
#: connections not yet authenticated from one address, and in all at most (and below the descriptor limit)
MAX_PENDING_PER_ADDRESS = 16
MAX_PENDING = 256
#: lines a second the server logs about refused connections and errors; the rest are counted
LOG_LINES_PER_S = 5.0
#: addresses that mean "every interface" (a Host header then may be any IP literal or this machine's name)
_WILDCARDS = ("", "0.0.0.0", "::")


def pending_cap(max_sessions: int) -> int:
    """Unauthenticated connections allowed at once: ``MAX_PENDING``, or fewer where the descriptor limit
    (``ulimit -n``) leaves room for less beside the sessions and the models' files."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return MAX_PENDING
    if soft == resource.RLIM_INFINITY:
        return MAX_PENDING
    return max(4, min(MAX_PENDING, (soft - 64 - max_sessions) // 2))


def host_header(host: str, port: int) -> str:
    """``host:port`` as a URL or a Host header writes it (an IPv6 literal in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allowed_hosts(host: str, port: int, extra: tuple[str, ...] = ()) -> set[str] | None:
    """The Host headers a request to a server listening on ``host:port`` may carry, or None for a wildcard
    address (then :func:`host_allowed` takes any IP literal and this machine's names)."""
    if host in _WILDCARDS:
        return None
    names = {host, *extra}
    try:
        if ipaddress.ip_address(host).is_loopback:
            names.add("localhost")
    except ValueError:
        if host == "localhost":
            names |= {"127.0.0.1", "::1"}
    return {h for n in names for h in (host_header(n, port), *([n if ":" not in n else f"[{n}]"]
                                                              if port in (80, 443) else []))}


def host_allowed(header: str, allowed: set[str] | None, port: int, extra: tuple[str, ...] = ()) -> bool:
    """Whether a request's Host header names this server (see :func:`allowed_hosts`)."""
    if allowed is not None:
        return header in allowed
    name, _, given = header.rpartition(":")
    if not name or given != str(port):
        return False
    name = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name.lower() in {"localhost", socket.gethostname().lower(), socket.getfqdn().lower(),
                                *(e.lower() for e in extra)}


class RateLimitedLog:
    """One line per event, at most ``per_s`` a second; what was held back is counted in the next line."""

    def __init__(self, say, per_s: float = LOG_LINES_PER_S) -> None:
        self.say, self.per_s = say, per_s
        self._budget, self._t = per_s, time.monotonic()
        self.held = 0

    def __call__(self, peer: str, what: str) -> None:
        now = time.monotonic()
        self._budget = min(self.per_s, self._budget + (now - self._t) * self.per_s)
        self._t = now
        if self._budget < 1.0:
            self.held += 1
            return
        self._budget -= 1.0
        if self.held:
            what, self.held = f"{what} ({self.held} more such lines held back)", 0
        self.say(peer, what)


class _OneLine(logging.Handler):
    """aiohttp's and asyncio's log records as one rate-limited line each, their tracebacks left out."""

    def __init__(self, log: RateLimitedLog) -> None:
        super().__init__(logging.WARNING)
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        why = f": {printable(type(exc).__name__ + ' ' + str(exc), 120)}" if exc is not None else ""
        self._log(record.name, printable(record.getMessage(), 120) + why)


class _Gate:
    """The connections that have not shown the token yet, each closed ``timeout_s`` after its accept or
    when newer ones from its address (``per_address``) or in all (``cap``) need its place."""

    def __init__(self, loop, cap: int, per_address: int, timeout_s: float, log: RateLimitedLog) -> None:
        self.loop, self.cap, self.per_address, self.timeout_s, self.log = loop, cap, per_address, timeout_s, log
        self.pending: dict = {}  # transport -> (address, timer), oldest first
        self.closed_unauthenticated = 0

    def opened(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "?"
        same = [t for t, (a, _) in self.pending.items() if a == address]
        if len(same) >= self.per_address:
            self._drop(same[0], f"closed: more than {self.per_address} connections from this address "
                                "without a token")
        elif len(self.pending) >= self.cap:
            self._drop(next(iter(self.pending)), f"closed: more than {self.cap} connections without a token")
        timer = self.loop.call_later(self.timeout_s, self._drop, transport,
                                     f"closed: no token within {self.timeout_s:.0f} s of connecting")
        self.pending[transport] = (address, timer)

    def authenticated(self, transport) -> None:
        entry = self.pending.pop(transport, None)
        if entry is not None:
            entry[1].cancel()

    closed = authenticated

    def _drop(self, transport, why: str) -> None:
        entry = self.pending.pop(transport, None)
        if entry is None:
            return
        entry[1].cancel()
        self.closed_unauthenticated += 1
        self.log(printable(entry[0], 60), why)
        transport.abort()


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, its accept and close told to the :class:`_Gate`."""

    def __init__(self, inner, gate: _Gate) -> None:
        self._inner, self._gate, self._transport = inner, gate, None

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._gate.opened(transport)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self):
        return self._inner.eof_received()

    def connection_lost(self, exc) -> None:
        self._gate.closed(self._transport)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _static(name: str) -> str:
    return resources.files("rtanon.serve").joinpath("static", name).read_text(encoding="utf-8")


class _AiohttpConnection:
    """:class:`rtanon.serve.host.Connection` over an aiohttp ``WebSocketResponse``."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws

    async def receive(self):
        msg = await self.ws.receive()
        if msg.type == WSMsgType.BINARY:
            return "bytes", msg.data
        if msg.type == WSMsgType.TEXT:
            return "text", msg.data
        if msg.type == WSMsgType.ERROR:
            return "error", self.ws.exception()
        return "closed", self.ws.close_code

    async def send_bytes(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def send_text(self, text: str) -> None:
        await self.ws.send_str(text)

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code=code, message=close_reason(reason))


class ServeServer(SessionHost):
    """A :class:`SessionHost` behind aiohttp on one address; ``allow_hosts``: more names the server may be
    reached by (its Host header), beside the address it listens on."""

    def __init__(self, *args, allow_hosts: tuple[str, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.allow_hosts = tuple(allow_hosts)
        self._hosts: set[str] | None = set()
        self._port = 0
        self._gate: _Gate | None = None
        self.refusals = RateLimitedLog(self.say)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_TEXT_BYTES)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/health", self._health)
        return app

    def _host_refusal(self, request: web.Request) -> str | None:
        hosts = request.headers.getall("Host", [])
        if len(hosts) != 1 or not host_allowed(hosts[0], self._hosts, self._port, self.allow_hosts):
            return f"unexpected Host {printable(hosts[0] if hosts else '', 60)!r} (not an address this server " \
                   "listens on; --allow-host NAME adds a name)"
        return None

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _page(self, request: web.Request) -> web.Response:
        """The microphone page; without the token a 401 that says how to open it."""
        peer = printable(request.remote or "?", 60)
        if (why := self._host_refusal(request)) is not None:
            self.refused += 1
            self.refusals(peer, f"page refused: {why}")
            return web.Response(status=403, headers=_PAGE_HEADERS, text=f"rtanon serve: {why}\n")
        if not self.token_ok(request.headers, request.query):
            self.refused += 1
            self.refusals(peer, "page refused: missing or wrong token")
            return web.Response(status=401, headers=_PAGE_HEADERS,
                                text="rtanon serve: missing or wrong token; open /?token=TOKEN with the token in "
                                     "the server's --token-file\n")
        self._authenticated(request)
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

    def _authenticated(self, request: web.Request) -> None:
        if self._gate is not None and request.transport is not None:
            self._gate.authenticated(request.transport)

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        peer = printable(request.remote or "?", 60)
        refusal = self._host_refusal(request)
        refusal = (403, refusal) if refusal is not None else self.refusal(
            request.headers, request.query, f"{request.scheme}://{request.host}")
        if refusal is not None:
            self.refused += 1
            self.refusals(peer, f"refused: {refusal[1]}")
            return web.Response(status=refusal[0], text=f"rtanon serve: {refusal[1]}\n")
        self._authenticated(request)
        ws = web.WebSocketResponse(max_msg_size=MAX_TEXT_BYTES, heartbeat=20.0)
        try:
            await ws.prepare(request)
        except ConnectionError:
            self.say(peer, "closed during the WebSocket handshake")
            return web.Response()
        await self.serve(_AiohttpConnection(ws), peer)
        return ws

    def _loop_error(self, loop, context: dict) -> None:
        """The event loop's errors (an accept past the descriptor limit, say): one rate-limited line."""
        exc = context.get("exception")
        why = f": {printable(type(exc).__name__ + ' ' + str(exc), 120)}" if exc is not None else ""
        self.refusals("server", printable(context.get("message", "error"), 120) + why)

    async def run(self, host: str, port: int, ssl_context=None, ready=None) -> None:
        """Serves until cancelled; ``ready(port)`` is called once listening (port 0: the OS picks one)."""
        self._loop = loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        one_line = _OneLine(self.refusals)
        loggers = [logging.getLogger(name) for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access",
                                                           "aiohttp.websocket", "asyncio")]
        saved = [(lg, lg.propagate) for lg in loggers]
        for lg in loggers:
            lg.addHandler(one_line)
            lg.propagate = False
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                               keepalive_timeout=HANDSHAKE_TIMEOUT_S)
        await runner.setup()
        self._gate = gate = _Gate(loop, pending_cap(self.config.max_sessions), MAX_PENDING_PER_ADDRESS,
                                  HANDSHAKE_TIMEOUT_S, self.refusals)
        listener = await loop.create_server(
            lambda: _Guarded(runner.server(), gate), host or None, port, ssl=ssl_context, reuse_address=True,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if ssl_context is not None else None)
        self._port = bound = listener.sockets[0].getsockname()[1]
        self._hosts = allowed_hosts(host, bound, self.allow_hosts)
        self.scheduler.start()
        try:
            if ready is not None:
                ready(bound)
            await asyncio.Event().wait()
        finally:
            self.scheduler.stop()
            if self._probe is not None:
                self._probe.cancel()
                self._probe = None
            listener.close()
            await runner.cleanup()
            for lg, propagate in saved:
                lg.removeHandler(one_line)
                lg.propagate = propagate
