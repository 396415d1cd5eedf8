"""``rtanon serve --ray-address ADDR --replicas K``: the sessions on Ray Serve, across machines.

Each replica of the :func:`build` deployment is one :class:`rtanon.serve.host.SessionHost` (its own
models and 20 ms batched scheduler) behind Ray Serve's proxy, which is the one ingress on
``--host``/``--port`` (TLS there with ``--certfile``/``--keyfile``). A WebSocket is routed to a
replica when it opens and stays on it for its life, so a session is pinned to the replica that holds
its state; Serve's router sends new sessions to the less busy replicas. A replica that dies takes its
connections with it (each client sees its WebSocket close) and Serve starts another; sessions on the
others, and new ones, go on. Give each replica a GPU (``--gpus-per-replica 1``) or a group of cores
(``--cpus-per-replica``).
"""

# No `from __future__ import annotations` here: FastAPI reads the handlers' annotations as objects (a string
# "WebSocket" in Ray's class-based view resolves to nothing, and the request is closed with 1008).
from fastapi import FastAPI, WebSocket
from fastapi.responses import PlainTextResponse

from rtanon.paths import printable
from rtanon.serve.host import CLOSE_POLICY, SessionHost, close_reason
from rtanon.serve.scheduler import realtime_process

APP_NAME = "rtanon"


class _StarletteConnection:
    """:class:`rtanon.serve.host.Connection` over an accepted Starlette ``WebSocket``."""

    def __init__(self, ws) -> None:
        self.ws = ws

    async def receive(self):
        msg = await self.ws.receive()
        if msg["type"] == "websocket.disconnect":
            return "closed", msg.get("code")
        if msg.get("bytes") is not None:
            return "bytes", msg["bytes"]
        return "text", msg.get("text")

    async def send_bytes(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def send_text(self, text: str) -> None:
        await self.ws.send_text(text)

    async def close(self, code: int, reason: str) -> None:
        try:
            await self.ws.close(code=code, reason=close_reason(reason).decode("utf-8"))
        except RuntimeError:  # already closed
            pass


def build(config, token: str, base, *, replicas: int, cpus_per_replica: float, gpus_per_replica: float):
    """The Ray Serve application: ``replicas`` copies of one SessionHost deployment behind a FastAPI ingress."""
    from ray import serve

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @serve.deployment(num_replicas=replicas, max_ongoing_requests=config.max_sessions + 8,
                      ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica})
    @serve.ingress(app)
    class SessionReplica:
        def __init__(self, config, token, base) -> None:
            import os

            name = f"{serve.get_replica_context().replica_id.unique_id}/{os.getpid()}"  # which replica, which process
            self.host = SessionHost(config, token, base=base, name=name)
            self.host.anonymizer_for(base.method, base.neural.privacy)
            realtime_process()
            self.host.scheduler.start()

        @app.get("/health")
        def health(self) -> PlainTextResponse:
            return PlainTextResponse("ok\n")

        @app.websocket("/ws")
        async def ws(self, websocket: WebSocket) -> None:
            peer = printable(websocket.client.host if websocket.client else "?", 60)
            scheme = "https" if websocket.url.scheme == "wss" else "http"
            refusal = self.host.refusal(websocket.headers, websocket.query_params,
                                        f"{scheme}://{websocket.headers.get('host', '')}")
            if refusal is not None:  # before accepting: the client sees the handshake refused
                self.host.refused += 1
                self.host.say(peer, f"refused: {refusal[1]}")
                await websocket.close(code=CLOSE_POLICY, reason=refusal[1])
                return
            await websocket.accept()
            await self.host.serve(_StarletteConnection(websocket), peer)

    return SessionReplica.bind(config, token, base)


def run(config, token: str, base, *, address: str, host: str, port: int, replicas: int,
        cpus_per_replica: float, gpus_per_replica: float, certfile: str | None, keyfile: str | None, say) -> None:
    """Connects to Ray (``address``; ``local`` starts one here, on loopback), deploys, and serves until Ctrl-C."""
    import ray
    from ray import serve

    from rtanon.corpus.on_ray import start_ray, stop_ray

    start_ray(None if address == "local" else address)  # a local Ray on loopback, with its watchdog
    try:
        http = {"host": host, "port": port}
        if certfile:
            http.update(ssl_certfile=certfile, ssl_keyfile=keyfile)
        serve.start(http_options=http)
        say(f"deploying {replicas} replicas on Ray ({ray.cluster_resources().get('CPU', 0):.0f} CPUs, "
            f"{ray.cluster_resources().get('GPU', 0):.0f} GPUs in the cluster)")
        serve.run(build(config, token, base, replicas=replicas, cpus_per_replica=cpus_per_replica,
                        gpus_per_replica=gpus_per_replica), name=APP_NAME, route_prefix="/")
        say(f"listening on {'wss' if certfile else 'ws'}://{host}:{port}/ws ({replicas} replicas; Ctrl-C stops)")
        import threading

        threading.Event().wait()
    finally:
        try:
            serve.shutdown()
        finally:
            stop_ray()
