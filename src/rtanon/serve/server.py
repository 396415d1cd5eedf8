"""The WebSocket server of ``rtanon serve`` on one machine (aiohttp, the ``[serve]`` extra).

Routes: ``GET /ws`` (one WebSocket = one session, see :mod:`rtanon.serve.protocol`) and
``GET /health`` (``ok``, no token: for load balancers). Every WebSocket request must carry the
server's token, as ``Authorization: Bearer TOKEN`` or (browsers cannot set headers) ``?token=TOKEN``
(401 otherwise); a request with an ``Origin`` other than the server's own is refused (403: a page
elsewhere cannot use a visitor's token); beyond ``max_sessions``, 503. What a session does is
:class:`rtanon.serve.host.SessionHost`'s; this module adapts aiohttp to it.
"""

from __future__ import annotations

import asyncio

from aiohttp import WSCloseCode, WSMsgType, web

from rtanon.paths import printable
from rtanon.serve.host import SessionHost
from rtanon.serve.protocol import MAX_TEXT_BYTES


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
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

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
