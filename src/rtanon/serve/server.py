"""The WebSocket server of ``rtanon serve`` on one machine (aiohttp, the ``[serve]`` extra).

Routes: ``GET /ws`` (one WebSocket = one session, see :mod:`rtanon.serve.protocol`),
``GET /?token=TOKEN`` (a page that streams the browser's microphone to ``/ws`` and plays the anonymized
voice: ``static/``, plain HTML/JS, served under a strict Content-Security-Policy), ``GET /static/NAME``
(its script, audio worklet and style sheet; no secret in them, no token) and ``GET /health`` (``ok``, no
token: for load balancers). Every WebSocket request must carry the
server's token, as ``Authorization: Bearer TOKEN`` or (browsers cannot set headers) ``?token=TOKEN``
(401 otherwise); a request with an ``Origin`` other than the server's own is refused (403: a page
elsewhere cannot use a visitor's token); beyond ``max_sessions``, 503. What a session does is
:class:`rtanon.serve.host.SessionHost`'s; this module adapts aiohttp to it.
"""

from __future__ import annotations

import asyncio
import re
from importlib import resources

from aiohttp import WSCloseCode, WSMsgType, web

from rtanon.paths import printable
from rtanon.serve.host import SessionHost
from rtanon.serve.protocol import MAX_TEXT_BYTES

#: the page's files (``static/``) and their content types
STATIC_FILES = {"app.js": "text/javascript", "worklet.js": "text/javascript", "style.css": "text/css"}
#: a Host header that may go into the page's Content-Security-Policy (anything else: 'self' alone)
_PLAIN_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
_PAGE_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                 "X-Content-Type-Options": "nosniff", "Permissions-Policy": "microphone=(self)"}


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
        await self.ws.close(code=code, message=reason.encode()[:120])


class ServeServer(SessionHost):
    """A :class:`SessionHost` behind aiohttp on one address."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_TEXT_BYTES)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _page(self, request: web.Request) -> web.Response:
        """The microphone page; without the token a 401 that says how to open it."""
        if not self.token_ok(request.headers, request.query):
            self.refused += 1
            self.say(printable(request.remote or "?", 60), "page refused: missing or wrong token")
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

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        peer = printable(request.remote or "?", 60)
        refusal = self.refusal(request.headers, request.query, f"{request.scheme}://{request.host}")
        if refusal is not None:
            self.refused += 1
            self.say(peer, f"refused: {refusal[1]}")
            return web.Response(status=refusal[0], text=f"rtanon serve: {refusal[1]}\n")
        ws = web.WebSocketResponse(max_msg_size=MAX_TEXT_BYTES, heartbeat=20.0)
        try:
            await ws.prepare(request)
        except ConnectionError:
            self.say(peer, "closed during the WebSocket handshake")
            return web.Response()
        await self.serve(_AiohttpConnection(ws), peer)
        return ws

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
