"""The live UI's web server: one local page, its JSON API and a WebSocket of status updates.

Safe by construction: it listens on 127.0.0.1 only, on a free port the OS
picks, and every request (page, files, API, WebSocket) must carry the random
token of the URL the terminal prints; a request from another Origin, or
naming another Host (DNS rebinding), is refused with 403. The page and its
files ship in ``rtanon/ui/static`` (no CDN, no build step).

Routes (each needs ``?token=``):

- ``GET /``: the page; ``GET /static/NAME``: its script and style sheet;
- ``GET /api/state``: ``LiveControl.status()``; ``GET /api/devices``: device choices;
- ``POST /api/action``: one action as JSON (``{"action": "mute", "value": true}``, see
  ``LiveControl.act``); answers ``{"ok": true, "status": ...}`` or ``{"error": MESSAGE}`` (400);
- ``GET /ws``: a WebSocket that sends ``{"type": "status", ...}`` about ``update_hz`` times a second
  and takes the same action messages as ``/api/action`` (answered with ``{"type": "result", ...}``).

The server only reads and drives the ``LiveControl``: closing the page leaves the audio running.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import sys
import tempfile
import webbrowser
from importlib import resources

from aiohttp import WSMsgType, web

STATIC_FILES = {"app.js": "text/javascript", "style.css": "text/css"}
TOKEN_PLACEHOLDER = "__TOKEN__"


def _static(name: str) -> str:
    return resources.files("rtanon.ui").joinpath("static", name).read_text(encoding="utf-8")


class UiServer:
    """The page and API of one ``LiveControl``, on 127.0.0.1 and a free port."""

    def __init__(self, control, *, update_hz: float = 10.0, token: str | None = None) -> None:
        self.control = control
        self.update_hz = update_hz
        self.token = token or secrets.token_urlsafe(24)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))  # loopback only; the OS picks a free port
        self.port = self.sock.getsockname()[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.origin}/?token={self.token}"
        self._hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}
        self._origins = {f"http://{host}" for host in self._hosts}
        self._runner: web.AppRunner | None = None

    # -- the gate every request passes -----------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if not secrets.compare_digest(request.query.get("token", "").encode(), self.token.encode()):
            raise web.HTTPForbidden(text="rtanon: missing or wrong token; open the URL the terminal printed")
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self._origins:
            raise web.HTTPForbidden(text="rtanon: requests from other pages are refused")
        if request.headers.get("Host") not in self._hosts:
            raise web.HTTPForbidden(text="rtanon: unexpected Host")
        response = await handler(request)
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._file)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/api/devices", self._devices)
        app.router.add_post("/api/action", self._action)
        app.router.add_get("/ws", self._ws)
        return app

    # -- handlers ---------------------------------------------------------------------
    async def _index(self, request: web.Request) -> web.Response:
        html = _static("index.html").replace(TOKEN_PLACEHOLDER, self.token)
        csp = (f"default-src 'self'; connect-src 'self' ws://127.0.0.1:{self.port} ws://localhost:{self.port}; "
               "img-src 'self' data:; frame-ancestors 'none'")
        return web.Response(text=html, content_type="text/html", headers={"Content-Security-Policy": csp})

    async def _file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        return web.Response(text=_static(name), content_type=STATIC_FILES[name])

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.control.status())

    async def _devices(self, request: web.Request) -> web.Response:
        devices = await asyncio.get_running_loop().run_in_executor(None, self.control.devices)
        return web.json_response(devices)

    async def _run_action(self, message) -> str | None:
        """Runs one action; returns an error message or None."""
        if not isinstance(message, dict):
            return "an action is a JSON object with an 'action' field"
        try:
            if message.get("action") == "mute":  # no thread hop: comfort noise at once
                self.control.act(message)
            else:  # opening devices and loading models block: off the event loop
                await asyncio.get_running_loop().run_in_executor(None, self.control.act, message)
        except Exception as exc:  # shown in the page; the audio keeps its last good state
            return str(exc) or type(exc).__name__
        return None

    async def _action(self, request: web.Request) -> web.Response:
        try:
            message = await request.json()
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python's stack
            return web.json_response({"error": "the body must be JSON"}, status=400)
        error = await self._run_action(message)
        if error is not None:
            return web.json_response({"error": error}, status=400)
        return web.json_response({"ok": True, "status": self.control.status()})

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        try:
            await ws.prepare(request)
        except ConnectionError:  # the page went away during the handshake: nothing to serve, say it briefly
            print("rtanon live: a page closed its connection during the WebSocket handshake", file=sys.stderr)
            return web.Response()  # aiohttp's own write of it fails quietly on the closed connection
        sender = asyncio.create_task(self._push(ws))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    message = json.loads(msg.data)
                except (ValueError, RecursionError):
                    message = None
                error = await self._run_action(message)
                await ws.send_json({"type": "result", "action": (message or {}).get("action")
                                    if isinstance(message, dict) else None, "ok": error is None, "error": error})
        finally:
            sender.cancel()
        return ws

    async def _push(self, ws: web.WebSocketResponse) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.update_hz
        t_next = loop.time()
        while not ws.closed:
            try:
                await ws.send_json({"type": "status", **self.control.status()})
            except ConnectionError:
                return
            t_next = max(t_next + period, loop.time())
            await asyncio.sleep(t_next - loop.time())

    # -- life cycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, self.sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _graphical_session() -> bool:
    """Whether a browser can open a window here (on a bare console webbrowser would start a text
    browser in this very terminal)."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _open_browser(url: str, folder: str) -> bool:
    """Opens ``url`` through a redirect file in a private folder, so that the token does not show on
    the browser's command line (which other users of the machine can read)."""
    from pathlib import Path

    from rtanon.atomic import write_text

    page = Path(folder) / "open-rtanon.html"
    write_text(page, f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={url}">'
                     f'<title>rtanon</title><a href="{url}">open the rtanon control page</a>\n')
    return webbrowser.open(page.as_uri())


def serve(control, *, open_browser: bool = True, stream=sys.stderr) -> None:
    """Serves the page until Ctrl-C (KeyboardInterrupt propagates to the caller)."""

    async def main() -> None:
        server = UiServer(control)
        await server.start()
        print(f"rtanon live: control page {server.url}\n"
              "rtanon live: closing the page keeps the audio running; Ctrl-C here stops it",
              file=stream, flush=True)
        with tempfile.TemporaryDirectory(prefix="rtanon-ui-") as folder:  # private: mode 0700
            if open_browser and not _graphical_session():
                print("rtanon live: no graphical session here: open the URL above in a browser", file=stream)
            elif open_browser:
                opened = await asyncio.get_running_loop().run_in_executor(None, _open_browser, server.url, folder)
                if not opened:
                    print("rtanon live: could not start a browser: open the URL above", file=stream)
            try:
                await asyncio.Event().wait()
            finally:
                await server.stop()

    asyncio.run(main())
