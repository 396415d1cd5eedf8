"""``rtanon live``: microphone in, anonymized voice out, in real time."""

from __future__ import annotations

from rtanon.commands._common import add_engine_args, add_seed_arg, anonymizer_from_args, identity_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "live", help="anonymize a microphone in real time into an output device or the virtual microphone",
        description="Reads the input device, anonymizes 16 kHz chunks in a worker thread, and plays the "
                    "result on the output device. With `rtanon virtual-device create` done, `--output rtanon` "
                    "feeds the microphone called rtanon that Zoom, Meet or a browser can pick. The status "
                    "line shows input level, latency, missed deadlines and device xruns; Ctrl-C stops. "
                    "Non-speech, warm-up, a late worker or an error play comfort noise, never your voice.",
        epilog="Devices: an index or name substring from `rtanon devices`, `pulse:NAME` for a "
               "PulseAudio/PipeWire source or sink, `rtanon` for the virtual microphone's sink.")
    p.add_argument("--input", metavar="DEV", default=None, help="input device (default: system default)")
    p.add_argument("--output", metavar="DEV", default=None, help="output device (default: system default)")
    add_engine_args(p)
    add_seed_arg(p)
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--device-rate", type=int, default=None, metavar="HZ",
                   help="open both devices at this rate (default: 16000 if accepted, else the device's own)")
    p.add_argument("--quiet", action="store_true", help="no status line")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from rtanon.commands._common import import_sounddevice
    from rtanon.errors import CliError

    import_sounddevice()
    from rtanon.live import run_live

    session = anonymizer_from_args(args).open_session(seed=args.seed, identity=identity_from_args(args))
    try:
        core = run_live(session, args.input, args.output, duration_s=args.duration,
                        device_rate_hz=args.device_rate, stream=None if args.quiet else sys.stderr)
    except ValueError as exc:  # sounddevice: no such device / ambiguous name
        raise CliError(f"{exc} (see `rtanon devices`)") from None
    c = session.counters
    print(f"stopped: {c.chunks} chunks ({c.speech_chunks} speech), missed deadlines {c.missed_deadlines}, "
          f"xruns {c.input_overflows + c.output_underflows}, stage errors {c.stage_errors}, "
          f"worker errors {core.worker_errors}")
    return 0
