"""``rtanon soak``: `rtanon live` for a long time under injected faults, measured."""

from __future__ import annotations

from rtanon.config import METHOD_NAMES


def register(sub) -> None:
    p = sub.add_parser(
        "soak", help="run `rtanon live` for a long time through a private PulseAudio, injecting faults",
        description="Starts a private PulseAudio daemon (your own sound server is not touched), plays speech into "
                    "a fake microphone, runs `rtanon live` from it into a fake output, records both, and injects "
                    "faults in turn: CPU overload (busy processes), a stage exception storm, the microphone "
                    "unloaded and reloaded, the output sink unloaded and reloaded, and SIGSTOP/SIGCONT of the live "
                    "process for 1 s. It prints the end-to-end delay over time and its drift, missed deadlines and "
                    "xruns, resident memory over time, the recovery time after each fault, and the maximum "
                    "normalised cross-correlation of the output with the microphone (raw voice would score "
                    "near 1).",
        epilog="Needs pulseaudio, pactl and pacat (apt-get install pulseaudio pulseaudio-utils "
               "libasound2-plugins). Example: rtanon soak --duration 3600 --speech a.wav b.flac --json")
    p.add_argument("--duration", type=float, default=120.0, metavar="S",
                   help="how long `rtanon live` runs (default: 120; at least 60, so that every fault happens once)")
    p.add_argument("--method", default="neural", choices=METHOD_NAMES, help="anonymization method (default: neural)")
    p.add_argument("--speech", nargs="+", default=None, metavar="FILE",
                   help="audio files played, each followed by 0.5 s of silence, in a loop, as the microphone "
                        "(default: the embedded speech sample)")
    p.add_argument("--period", type=float, default=None, metavar="S",
                   help="seconds between faults (default: 60, or less so each fault happens at least once)")
    p.add_argument("--seed", type=int, default=None, help="pin the live session's pseudo-voice")
    p.add_argument("--report", metavar="FILE", default=None, help="also write the JSON report to FILE")
    p.add_argument("--keep", metavar="DIR", default=None,
                   help="also keep both recordings (mic.flac, output.flac) and the raw run (run.json) in DIR")
    p.add_argument("--json", action="store_true", help="print the JSON report on the last line")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import shutil
    import sys

    import numpy as np

    from rtanon.live import soak
    from rtanon.commands._common import import_sounddevice
    from rtanon.errors import CliError
    from rtanon.live.pulse import PulseError

    try:
        soak.schedule(args.duration, args.period)
    except soak.SoakError as exc:
        raise CliError(str(exc)) from None
    missing = [t for t in ("pulseaudio", "pactl", "pacat") if shutil.which(t) is None]
    if missing:
        raise CliError(f"needs {', '.join(missing)}: sudo apt-get install pulseaudio pulseaudio-utils "
                       "libasound2-plugins")
    import_sounddevice()  # a one-line error if PortAudio is missing
    if args.speech:
        speech = soak.speech_for_soak(args.speech)
    else:
        from rtanon.bench import speech_signal

        speech = np.concatenate((speech_signal(10.0), np.zeros(8000, np.float32)))
    tty = sys.stderr.isatty()

    def progress(text: str) -> None:
        print(("\r" + text + "   ") if tty else text, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        report = soak.run(speech, args.duration, args.method, seed=args.seed, period_s=args.period,
                          progress=progress, keep_dir=args.keep)
    except (PulseError, soak.SoakError) as exc:
        raise CliError(f"soak: {exc}") from None
    if tty:
        print(file=sys.stderr)
    print(soak.format_report(report))
    if args.report:
        from rtanon.atomic import write_text

        write_text(args.report, json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report))
    return 0 if report["live_exit_code"] == 0 else 1
