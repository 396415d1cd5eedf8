"""The ``rtanon`` command line: the one entry point for users and researchers.

Each subcommand is a module with ``register(subparsers)``; heavy imports happen inside the command.
Run-time commands live in ``rtanon.commands``; ``train`` (model recipes) and ``lab`` (research tools)
live in ``rtanon.train.commands``, the training package, which only this list names: registering them
imports argparse code only, and nothing of the run time imports ``rtanon.train``."""

from __future__ import annotations

import argparse
import importlib
import sys

from rtanon import __version__
from rtanon.errors import UserError

#: Subcommand modules, in the order ``rtanon --help`` lists them.
COMMANDS = [
    *(f"rtanon.commands.{name}" for name in (
        "demo", "devices", "live", "ui", "file", "anonymize_dir", "virtual_device", "bench", "soak",
        "identity", "pool", "f0", "f0_bench", "eval")),
    "rtanon.train.commands.train", "rtanon.train.commands.lab",
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
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except UserError as exc:
        print(f"rtanon {args.command}: error: {exc}", file=sys.stderr)
        return 2
