"""``rtanon serve``: anonymize many live voices over WebSocket, every stage batched across sessions."""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

from rtanon.commands._common import add_engine_args
from rtanon.errors import install_hint

TOKEN_CHARS_MIN = 16
MAX_TOKEN_FILE_BYTES = 4096


def register(sub) -> None:
    from rtanon.serve.scheduler import ServeConfig

    d = ServeConfig()
    p = sub.add_parser(
        "serve", help="a WebSocket server that anonymizes many live sessions at once (batched)",
        description="Each WebSocket connection to /ws is one live session: 20 ms frames of 16 kHz PCM16 in, "
                    "the anonymized frames out with their sequence numbers (protocol: rtanon.serve.protocol). "
                    "Every 20 ms one batched step runs all sessions; a frame not ready by its deadline is "
                    "answered with comfort noise, never with the input. Each session gets a fresh voice "
                    "unless its start message pins an identity. Every connection needs the token in "
                    "--token-file (as `Authorization: Bearer TOKEN` or ?token=TOKEN). The page at "
                    "/?token=TOKEN streams a browser's microphone and plays the anonymized voice back; "
                    "`rtanon connect` runs the live loop of a machine without the models against this server.",
        epilog="Examples: `rtanon serve --token-file ~/.config/rtanon/serve-token` (loopback, port 8765); "
               "`rtanon serve --host 0.0.0.0 --certfile cert.pem --keyfile key.pem --token-file T`. "
               "Measure what a machine holds with `rtanon bench --serve --sessions N`.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1; any other needs --certfile/--keyfile or "
                        "--insecure)")
    p.add_argument("--port", type=int, default=8765, help="TCP port (default: 8765; 0: any free port)")
    p.add_argument("--token-file", metavar="FILE", required=True,
                   help="the bearer token every connection must show; created with a fresh random token "
                        "(mode 0600) when FILE does not exist")
    p.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                   help="a name clients reach the server by (its Host header: a DNS name of this machine), beside "
                        "the address it listens on; others are refused (DNS rebinding). Repeatable")
    p.add_argument("--certfile", metavar="PEM", default=None, help="TLS certificate chain (wss://)")
    p.add_argument("--keyfile", metavar="PEM", default=None, help="TLS private key")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --host without TLS (audio and token in clear text: a trusted "
                        "network only)")
    p.add_argument("--max-sessions", type=int, default=d.max_sessions,
                   help=f"sessions served at once; more are refused with 503 (default: {d.max_sessions})")
    p.add_argument("--deadline-ms", type=int, default=d.deadline_ms,
                   help="a frame answered later than this after it arrived gets comfort noise instead "
                        f"(default: {d.deadline_ms})")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="threads that run parts of each batched call at once (content encoder, vocoder, McAdams "
                        "frames on the CPU; default: the cores this process may use, at most 8; on Ray: "
                        "--cpus-per-replica)")
    ray = p.add_argument_group("across machines, on Ray Serve (the [serve-ray] extra)")
    ray.add_argument("--ray-address", metavar="ADDR", default=None,
                     help="serve on this Ray cluster (`ray start --head` prints its address; `local` starts one "
                          "on this machine): Ray Serve's proxy listens on --host/--port and routes each session to "
                          "a replica for its life")
    ray.add_argument("--replicas", type=int, default=1, metavar="K",
                     help="with --ray-address: replicas of the batched server, each with its own models (default: 1)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, metavar="C",
                     help="with --ray-address: CPU cores Ray reserves for each replica (default: 1)")
    ray.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="G",
                     help="with --ray-address: GPUs per replica (default: 0; 1 for one replica per GPU)")
    add_engine_args(p, chunk=False)  # the protocol's 20 ms frames are the chunk
    p.set_defaults(func=run)


def read_token(path: str, say) -> str:
    """The token in ``path``; a new random one written there (0600) when it does not exist."""
    from rtanon.errors import CliError
    from rtanon.paths import printable

    file = Path(path)
    if file.is_dir():
        raise CliError(f"--token-file {printable(path)} is a directory: name a file in it (created when missing)")
    if not file.exists():
        token = secrets.token_urlsafe(32)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        say(f"wrote a new token to {printable(file)}")
        return token
    return load_token(path, "delete the file to get a fresh one", say)


def load_token(path: str, fix: str, say=None) -> str:
    """The token in the existing file ``path``, checked; ``fix`` says how to mend a bad one
    (``rtanon connect`` reads a copy of the server's file this way); ``say`` gets a warning when other
    users may read the file."""
    from rtanon.errors import CliError
    from rtanon.paths import InputPathError, printable, read_capped

    if not Path(path).exists():
        raise CliError(f"--token-file {printable(path)}: no such file; copy the file that `rtanon serve "
                       "--token-file` wrote on the server")
    try:
        token = read_capped(Path(path), MAX_TOKEN_FILE_BYTES, "token file").decode("utf-8").strip()
    except (InputPathError, OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--token-file {printable(path)}: {printable(exc, 120)}") from None
    if len(token) < TOKEN_CHARS_MIN or not token.isprintable() or " " in token:
        raise CliError(f"--token-file {printable(path)}: the token must be one word of at least "
                       f"{TOKEN_CHARS_MIN} printable characters ({fix})")
    mode = Path(path).stat().st_mode & 0o777
    if mode & 0o077 and say is not None:
        say(f"warning: {printable(path)} is readable by other users (mode {mode:04o}): anyone here can use the "
            f"token; chmod 600 {printable(path)}")
    return token


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args) -> int:
    import asyncio
    import ssl
    import sys

    from rtanon.commands._common import config_from_args
    from rtanon.errors import CliError
    from rtanon.paths import printable

    try:
        from rtanon.serve.server import ServeServer, host_header
    except ImportError:
        raise CliError(f"rtanon serve needs the [serve] extra: {install_hint('serve')}") from None
    from rtanon.serve.scheduler import ServeConfig, default_workers, realtime_process

    def say(text: str) -> None:
        print(f"rtanon serve: {text}", file=sys.stderr, flush=True)

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port}: use 0 to 65535")
    if (args.certfile is None) != (args.keyfile is None):
        raise CliError("TLS needs both --certfile and --keyfile")
    if not _is_loopback(args.host) and args.certfile is None and not args.insecure:
        raise CliError(f"--host {args.host} is reachable from other machines: give --certfile and --keyfile "
                       "(wss://), or --insecure on a trusted network")
    workers = {} if args.workers is None else {"workers": args.workers}
    if args.ray_address is not None and args.workers is None:
        workers = {"workers": default_workers(args.cpus_per_replica)}
    config = ServeConfig(max_sessions=args.max_sessions, deadline_ms=args.deadline_ms, **workers)
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    ssl_context = None
    if args.certfile is not None:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ssl_context.load_cert_chain(args.certfile, args.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise CliError(f"--certfile/--keyfile: {exc}") from None
    token = read_token(args.token_file, say)
    base = config_from_args(args)
    if args.ray_address is not None:
        return run_on_ray(args, config, token, base, say)
    if args.replicas != 1:
        raise CliError("--replicas needs --ray-address (one process serves as one replica)")
    server = ServeServer(config, token, base=base, allow_hosts=tuple(args.allow_host))
    say(f"loading the {args.method} models")
    server.anonymizer_for(base.method, base.neural.privacy)  # the default session's models, before listening
    realtime_process()
    scheme = "wss" if ssl_context else "ws"

    def ready(port: int) -> None:
        where = host_header(args.host, port)
        say(f"listening on {scheme}://{where}/ws (up to {config.max_sessions} sessions; Ctrl-C stops); "
            f"the page: {'https' if ssl_context else 'http'}://{where}/?token=TOKEN, TOKEN from "
            f"{printable(args.token_file)}")

    try:
        asyncio.run(server.run(args.host, args.port, ssl_context, ready))
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


def run_on_ray(args, config, token: str, base, say) -> int:
    from rtanon.errors import CliError

    if args.port == 0:
        raise CliError("--port 0: Ray Serve's proxy needs a fixed port")
    if args.replicas < 1 or args.cpus_per_replica < 0 or args.gpus_per_replica < 0:
        raise CliError("--replicas must be 1 or more, --cpus/--gpus-per-replica 0 or more")
    try:
        from rtanon.serve import ray_serve
        import ray.serve  # noqa: F401
    except ImportError:
        raise CliError(f"--ray-address needs Ray Serve: {install_hint('serve-ray')}") from None
    ray_serve.run(config, token, base, address=args.ray_address, host=args.host, port=args.port,
                  replicas=args.replicas, cpus_per_replica=args.cpus_per_replica,
                  gpus_per_replica=args.gpus_per_replica, certfile=args.certfile, keyfile=args.keyfile, say=say)
    return 0
