"""``rtanon live``: microphone in, anonymized voice out, in real time (``--ui``: with a local control page)."""

from __future__ import annotations

from rtanon.commands._common import add_engine_args, add_seed_arg, anonymizer_from_args, identity_from_args
from rtanon.errors import install_hint


def register(sub) -> None:
    p = sub.add_parser(
        "live", help="anonymize a microphone in real time into an output device or the virtual microphone",
        description="Reads the input device, anonymizes 16 kHz chunks in a worker thread, and plays the "
                    "result on the output device. With `rtanon virtual-device create` done, `--output rtanon` "
                    "feeds the microphone called rtanon that Zoom, Meet or a browser can pick. The status "
                    "line shows input level, latency, missed deadlines and device xruns; Ctrl-C stops. "
                    "Non-speech, warm-up, a late worker or an error play comfort noise, never your voice. "
                    "With --ui a local page (127.0.0.1, a random port and token) shows meters, latency and "
                    "the voice, and offers device pickers, mute, new voice, method, privacy point, chunk size "
                    "and a monitor.",
        epilog="Devices: an index or name substring from `rtanon devices`, `pulse:NAME` for a "
               "PulseAudio/PipeWire source or sink, `rtanon` for the virtual microphone's sink. "
               "`rtanon ui` starts the page again with the last-used devices, method, privacy point and "
               "chunk.")
    add_device_args(p)
    add_engine_args(p)
    add_seed_arg(p)
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds of running, counted once the devices are open (not with --ui)")
    p.add_argument("--quiet", action="store_true", help="no status line")
    p.add_argument("--ui", action="store_true",
                   help="serve a control page on 127.0.0.1 and open it in the browser (needs the [ui] extra); "
                        "closing the page keeps the audio running, Ctrl-C stops")
    add_ui_args(p)
    p.add_argument("--status-interval", type=float, default=0.5, metavar="S",
                   help="seconds between status updates (default: 0.5)")
    p.add_argument("--json-status", action="store_true",
                   help="print the status as one JSON object per line on stdout (counters, delay, devices up)")
    p.add_argument("--fault-injection", action="store_true",
                   help="testing (`rtanon soak` uses it): SIGUSR1 makes every chunk's stages fail until SIGUSR2; "
                        "the output is comfort noise meanwhile")
    p.set_defaults(func=run)


def add_device_args(p) -> None:
    p.add_argument("--input", metavar="DEV", default=None, help="input device (default: system default)")
    p.add_argument("--output", metavar="DEV", default=None, help="output device (default: system default)")
    p.add_argument("--device-rate", type=int, default=None, metavar="HZ",
                   help="open the devices at this rate (default: 16000 if accepted, else the device's own)")


def add_ui_args(p) -> None:
    p.add_argument("--monitor", metavar="DEV", default=None,
                   help="with the page: also play the anonymized voice here (headphones), to hear what others hear")
    p.add_argument("--no-browser", action="store_true", help="with the page: print its URL, do not open a browser")


def run(args) -> int:
    import sys

    from rtanon.commands._common import import_sounddevice
    from rtanon.errors import CliError, UserError

    import_sounddevice()
    if args.ui:
        from rtanon.live.control import LiveSettings

        settings = LiveSettings(input=args.input, output=args.output, monitor=args.monitor, method=args.method,
                                privacy=args.privacy, chunk_ms=args.chunk_ms)
        return run_ui(args, settings)
    if args.monitor is not None or args.no_browser:
        raise CliError("--monitor and --no-browser go with --ui")
    from rtanon.live.devices import resolve_device
    from rtanon.live.feedback import refuse_feedback
    from rtanon.live.loop import run_live

    # before the models load: a missing device or a loop is a quick one-line error
    refuse_feedback(*resolve_device(args.input, "input"), *resolve_device(args.output, "output"))
    if not 0.05 <= args.status_interval <= 60:
        raise CliError(f"--status-interval {args.status_interval}: use 0.05 to 60 seconds")
    session = anonymizer_from_args(args).open_session(seed=args.seed, identity=identity_from_args(args))
    if args.fault_injection:
        from rtanon.live.faults import install_fault_injection

        install_fault_injection(session)
    try:
        core = run_live(session, args.input, args.output, duration_s=args.duration,
                        device_rate_hz=args.device_rate, stream=None if args.quiet else sys.stderr,
                        status_interval_s=args.status_interval,
                        json_status=sys.stdout if args.json_status else None)
    except UserError:
        raise
    except ValueError as exc:  # sounddevice: no such device / ambiguous name
        raise CliError(f"{exc} (see `rtanon devices`)") from None
    c = session.counters
    print(f"stopped: {c.chunks} chunks ({c.speech_chunks} speech), missed deadlines {c.missed_deadlines}, "
          f"xruns {c.input_overflows + c.output_underflows}, stage errors {c.stage_errors}, "
          f"worker errors {core.worker_errors}" + (f" (last: {c.last_error})" if c.last_error else ""))
    return 0


def run_ui(args, settings) -> int:
    """Runs the live anonymizer behind the control page until Ctrl-C (KeyboardInterrupt goes on to the CLI,
    which exits 130 as documented, after the summary)."""
    import sys

    from rtanon.commands._common import config_from_args
    from rtanon.errors import CliError
    from rtanon.live.control import LiveControl

    try:
        from rtanon.ui.server import serve
    except ImportError as exc:
        raise CliError(f"the control page needs the [ui] extra ({exc}): {install_hint('ui')}") from None
    if getattr(args, "duration", None) is not None:
        raise CliError("--duration does not go with --ui (Ctrl-C stops)")
    settings.validate()
    control = LiveControl(settings, config_from_args(args), seed=getattr(args, "seed", None),
                          identity=identity_from_args(args), device_rate_hz=args.device_rate)
    try:
        control.start()
    except Exception as exc:  # the page stays up: pick another device there
        control.last_error = f"could not start the audio: {exc}"
        print(f"rtanon live: {control.last_error}", file=sys.stderr)
    try:
        serve(control, open_browser=not args.no_browser)
    finally:
        control.stop()
        c = control.session.counters if control.session is not None else None
        if c is not None:
            print(f"stopped: {c.chunks} chunks ({c.speech_chunks} speech), missed deadlines "
                  f"{c.missed_deadlines}, xruns {c.input_overflows + c.output_underflows}, stage errors "
                  f"{c.stage_errors}")
    return 0
