"""``rtanon ui``: the live anonymizer and its control page, with the last-used settings."""

from __future__ import annotations

from rtanon.commands.live import add_ui_args


def register(sub) -> None:
    p = sub.add_parser(
        "ui", help="open the live control page with the last-used devices, method, privacy point and chunk "
                   "size",
        description="Starts `rtanon live --ui` with the settings the page last used (devices, monitor, method, "
                    "privacy point, chunk size; kept in ~/.config/rtanon/live-ui.json, or $XDG_CONFIG_HOME). The "
                    "pseudo-voice is fresh every time; your own voice is never stored. The page listens on "
                    "127.0.0.1 behind a random token printed here; closing it keeps the audio running, Ctrl-C "
                    "stops.")
    add_ui_args(p)
    p.add_argument("--device-rate", type=int, default=None, metavar="HZ",
                   help="open the devices at this rate (default: 16000 if accepted, else the device's own)")
    p.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import replace

    from rtanon.commands._common import import_sounddevice
    from rtanon.commands.live import run_ui
    from rtanon.live.control import load_settings

    import_sounddevice()
    settings = load_settings()
    if args.monitor is not None:
        settings = replace(settings, monitor=args.monitor)
    args.method, args.privacy, args.chunk_ms = settings.method, settings.privacy, settings.chunk_ms
    return run_ui(args, settings)
