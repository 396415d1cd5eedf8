"""``rtanon connect``: ``rtanon live`` with the compute on an ``rtanon serve`` server (a thin client)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from rtanon.commands.live import add_device_args
from rtanon.config import METHOD_NAMES, PRIVACY_POINTS


def register(sub) -> None:
    from rtanon.serve.remote import RemoteConfig

    d = RemoteConfig()
    p = sub.add_parser(
        "connect", help="the live loop with the anonymization done by an `rtanon serve` server (no models here)",
        description="Like `rtanon live` (the same devices, status line and fail-closed output), but each 20 ms "
                    "frame goes to an `rtanon serve` server, which anonymizes it, and its answer is played: "
                    "a laptop without the models (or a GPU) gets the neural voice. An answer that is not back "
                    "within --pipeline-ms, and everything while the server is away, plays comfort noise, never "
                    "your voice, and counts as a missed deadline; the client reconnects by itself, after a pause "
                    "that doubles up to 5 s (the new session has a fresh voice unless --identity pins it). A server "
                    "whose first message is not a ready message for this session is refused (exit 2); one that "
                    "sends your own frames back is never played and the session ends (exit 1). The status line "
                    "adds the server's round trip, or DOWN and the next retry. Ctrl-C stops (exit 130).",
        epilog="Example: on the server `rtanon serve --host 0.0.0.0 --certfile cert.pem --keyfile key.pem "
               "--token-file token`; copy `token` to the laptop, then `rtanon connect --server "
               "wss://server.example:8765 --token-file token --input 2 --output rtanon`. The delay is the "
               "server's algorithmic latency plus --pipeline-ms plus the devices'.")
    p.add_argument("--server", metavar="URL", required=True,
                   help="the server's WebSocket: ws://HOST:PORT or wss://HOST:PORT (TLS), as `rtanon serve` "
                        "prints it; the path /ws is added when missing; plain ws:// sends your voice unencrypted, "
                        "so use it on loopback or a trusted network only")
    p.add_argument("--token-file", metavar="FILE", required=True,
                   help="a copy of the server's --token-file (the token is not given on the command line, where "
                        "other users could read it)")
    add_device_args(p)
    p.add_argument("--method", default=None, choices=METHOD_NAMES, help="anonymization method (default: the server's)")
    p.add_argument("--privacy", default=None, choices=PRIVACY_POINTS,
                   help="neural method: which shipped vocoder (default: the server's); see `rtanon live --help`")
    p.add_argument("--identity", metavar="FILE", default=None,
                   help="pin a pseudo-speaker made by `rtanon identity new` (neural method; the server gets the "
                        "file's voice, never yours; sessions using it can be linked)")
    p.add_argument("--pipeline-ms", type=int, default=d.pipeline_ms, metavar="MS",
                   help="how long each frame's answer may take to come back before comfort noise plays instead; "
                        f"added to the delay (a multiple of 20; default: {d.pipeline_ms}, enough for the server's "
                        "60 ms deadline on a LAN; raise it over a slow network, lower it on loopback)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds of running, counted once the devices are open")
    p.add_argument("--quiet", action="store_true", help="no status line")
    p.add_argument("--status-interval", type=float, default=0.5, metavar="S",
                   help="seconds between status updates (default: 0.5)")
    p.set_defaults(func=run)


def server_url(text: str) -> str:
    """``--server`` as the WebSocket URL to open: ws(s)://HOST:PORT/ws (http(s):// is taken as ws(s)://). An
    IPv6 address may come with or without brackets (``ws://[::1]:P`` or ``ws://::1:P``: the last ``:P`` is
    the port)."""
    import ipaddress

    from rtanon.errors import CliError
    from rtanon.paths import printable

    shown = printable(text, 80)
    parts = urlsplit(text)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    netloc = parts.netloc
    if "@" in netloc:
        raise CliError(f"--server {shown}: no user name or password in the URL; the server's token goes in "
                       "--token-file, and the URL is ws://HOST:PORT or wss://HOST:PORT")
    if netloc.count(":") >= 2 and not netloc.startswith("["):  # an IPv6 address without its brackets
        host, _, port = netloc.rpartition(":")
        try:
            if not port.isdigit() or ipaddress.ip_address(host.split("%")[0]).version != 6:
                raise ValueError(host)
        except ValueError:
            raise CliError(f"--server {shown}: an IPv6 address goes in brackets, with the port after them: "
                           "ws://[ADDRESS]:PORT") from None
        netloc = f"[{host}]:{port}"
        parts = urlsplit(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)))
    if scheme not in ("ws", "wss") or not parts.hostname or parts.query or parts.fragment:
        raise CliError(f"--server {shown}: use ws://HOST:PORT or wss://HOST:PORT, as `rtanon serve` "
                       "printed it (the token goes in --token-file, not in the URL)")
    try:
        parts.port
    except ValueError:
        raise CliError(f"--server {shown}: the port must be a number from 1 to 65535") from None
    return urlunsplit((scheme, netloc, parts.path if parts.path not in ("", "/") else "/ws", "", ""))


def start_message(args) -> dict:
    """The session's start message: method, privacy and identity as asked (else the server's defaults)."""
    from rtanon.commands._common import identity_from_args
    from rtanon.errors import CliError

    start = {k: v for k, v in (("method", args.method), ("privacy", args.privacy)) if v is not None}
    if args.identity is not None and args.method == "mcadams":
        raise CliError("--identity pins a neural voice: it does not go with --method mcadams")
    identity = identity_from_args(args)
    if identity is not None:
        start["method"] = "neural"
        start["identity"] = identity.to_json()
    return start


def run(args) -> int:
    import sys

    from rtanon.commands._common import import_sounddevice
    from rtanon.commands.serve import load_token
    from rtanon.errors import CliError, RunFailed, UserError
    from rtanon.paths import printable

    try:
        import aiohttp  # noqa: F401
    except ImportError:
        from rtanon.errors import install_hint

        raise CliError(f"rtanon connect needs aiohttp, of the [ui] extra (no models needed): {install_hint('ui')}") \
            from None
    from rtanon.serve.remote import RemoteConfig, RemoteSession
    if not 0.05 <= args.status_interval <= 60:
        raise CliError(f"--status-interval {args.status_interval}: use 0.05 to 60 seconds")
    config = RemoteConfig(pipeline_ms=args.pipeline_ms)
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(f"--pipeline-ms {args.pipeline_ms}: {str(exc).split(': ', 1)[1]}") from None
    url = server_url(args.server)
    token = load_token(args.token_file, "copy the server's --token-file again")
    start = start_message(args)
    import_sounddevice()
    from rtanon.live.devices import resolve_device
    from rtanon.live.loop import run_live

    session = RemoteSession(url, token, start, config).open()  # the server's refusal first: it says the most
    ready = session.ready  # checked: a ready message for this session (rtanon.serve.client.check_ready)
    print(f"rtanon connect: session {printable(ready['session'], 64)} on {printable(url)} ({ready['method']}; "
          f"server latency {ready['latency_ms']:.0f} ms + pipeline {config.pipeline_ms} ms)",
          file=sys.stderr, flush=True)
    try:
        for spec, kind in ((args.input, "input"), (args.output, "output")):
            resolve_device(spec, kind)
        core = run_live(session, args.input, args.output, duration_s=args.duration,
                        device_rate_hz=args.device_rate, stream=None if args.quiet else sys.stderr,
                        status_interval_s=args.status_interval, name="rtanon connect", extra_status=session.status,
                        stop_when=lambda: bool(session.failed))
    except UserError:
        raise
    except ValueError as exc:  # sounddevice: no such device / ambiguous name
        raise CliError(f"{exc} (see `rtanon devices`)") from None
    finally:
        session.close()
    s, c = session.stats(), session.counters
    print(f"stopped: {c.chunks} frames ({c.speech_chunks} speech), missed deadlines {c.missed_deadlines} "
          f"(late answers {s['late']}, server away {s['unsent']}), reconnects {s['reconnects']}, round trip "
          f"p50 {s['round_trip_ms_p50']} ms p99 {s['round_trip_ms_p99']} ms, xruns "
          f"{c.input_overflows + c.output_underflows}, worker errors {core.worker_errors}")
    if session.failed:
        raise RunFailed(session.failed)
    if core.interrupted:
        raise KeyboardInterrupt  # the CLI says so and exits 130
    return 0
