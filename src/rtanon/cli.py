"""The ``rtanon`` command line. Each subcommand lives in ``rtanon.commands.<name>``
with ``register(subparsers)``; heavy imports happen inside the command."""

from __future__ import annotations

import argparse
import importlib
import sys

from rtanon import __version__

#: Subcommand modules, in the order ``rtanon --help`` lists them.
COMMANDS = [
    "demo", "devices", "live", "file", "anonymize_dir", "virtual_device", "bench",
    "identity", "pool", "f0", "f0_bench", "eval", "train",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rtanon",
        description="rtanon: real-time voice anonymizer. The other side hears your words and "
                    "intonation in a different, consistent voice that cannot be linked back to you.",
        epilog="Start with `rtanon demo`, then `rtanon virtual-device create` and "
               "`rtanon live --input <your mic> --output rtanon`. `rtanon COMMAND --help` for details.",
    )
    parser.add_argument("--version", action="version", version=f"rtanon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"rtanon.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from rtanon.errors import USER_ERRORS

        if isinstance(exc, USER_ERRORS):
            print(f"rtanon {args.command}: error: {exc}", file=sys.stderr)
            return 2
        raise
