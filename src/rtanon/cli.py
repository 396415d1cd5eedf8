"""The ``rtanon`` command line: the one entry point for users and researchers.

Each subcommand is a module with ``register(subparsers)``; heavy imports happen inside the command.
Run-time commands live in ``rtanon.commands``; ``train`` (model recipes) and ``lab`` (research tools)
live in ``rtanon.train.commands``, the training package, which only this list names: registering them
imports argparse code only, and nothing of the run time imports ``rtanon.train``."""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import signal
import sys
import threading
import traceback

from rtanon import __version__
from rtanon.errors import Interrupted, UserError, forget_interrupts, install_hint, interrupt
from rtanon.paths import printable

#: The longest error line: a message carries paths and fields of files, which anyone may have written.
ERROR_CHARS = 2000

#: Subcommand modules, in the order ``rtanon --help`` lists them.
COMMANDS = [
    *(f"rtanon.commands.{name}" for name in (
        "demo", "devices", "live", "ui", "file", "anonymize_dir", "virtual_device", "bench", "soak",
        "identity", "pool", "f0", "f0_bench", "eval", "serve", "connect")),
    "rtanon.train.commands.train", "rtanon.train.commands.lab",
]


#: Exit statuses, as ``rtanon --help`` and the README list them.
EXIT_CODES = (
    (0, "success"),
    (1, "the run failed although its input was usable (e.g. chunks of a file failed and none was anonymized: "
        "no output written)"),
    (2, "a usage error: bad option, unreadable or truncated input, unwritable output, missing device or tool"),
    (3, "an internal error (a bug: run again with --debug and report the traceback)"),
    (129, "stopped by SIGHUP"),
    (130, "interrupted (Ctrl-C, SIGINT)"),
    (143, "stopped by SIGTERM"),
)


def extra_providing(module: str, command: str = "") -> str | None:
    """The pip extra of rtanon that installs the (missing) top-level ``module``, from the installed rtanon's
    metadata (the extras of pyproject.toml); ``command``'s own extra where several do, else the first that asks
    for the plain package (``corpus``'s ray before ``serve-ray``'s ray[serve]); None when no extra
    does (a base dependency, or rtanon's own code: a bug) or rtanon is not installed."""
    import re
    from importlib import metadata

    try:
        requires = metadata.requires("rtanon") or []
    except metadata.PackageNotFoundError:
        return None
    want = module.lower().replace("_", "-")
    base, extras = set(), []
    for req in requires:
        m = re.match(r"([A-Za-z0-9._-]+).*?(?:;\s*extra\s*==\s*[\"']([^\"']+)[\"'])?$", req)
        if not m:
            continue
        dist = m.group(1).lower().replace("_", "-").replace(".", "-")
        if dist == want or dist.startswith(want + "-"):  # pyworld from pyworld-prebuilt
            if m.group(2):  # an extra that asks for the package with extras of its own ("ray[serve]") comes last
                extras.append((f"{dist}[" in req.lower().replace("_", "-"), m.group(2)))
            else:
                base.add(dist)
    if base or not extras:
        return None
    names = [name for _, name in sorted(extras, key=lambda e: e[0])]
    return command if command in names else names[0]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage is one `--help` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    codes = "; ".join(f"{code} {text}" for code, text in EXIT_CODES)
    parser = _Parser(
        prog="rtanon",
        description="rtanon: real-time voice anonymizer. The other side hears your words and "
                    "intonation in a different, consistent voice that cannot be linked back to you.",
        epilog="Start with `rtanon demo`, then `rtanon virtual-device create` and "
               "`rtanon live --input <your mic> --output rtanon`. `rtanon COMMAND --help` for details. "
               f"Errors are one line on stderr. Exit status: {codes}.",
    )
    kernel = ("C++" if importlib.util.find_spec("rtanon._core") is not None
              else "Numba (installed without a C++ compiler)")
    parser.add_argument("--version", action="version", version=f"rtanon {__version__}, F0 kernel {kernel}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of any error (accepted anywhere on the line)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def _raise_interrupted(signum, frame):
    interrupt(signum, frame)


def _report_native_crashes() -> None:
    """A crash inside native code (a Numba kernel, ONNX Runtime, PortAudio) prints every thread's Python
    stack to stderr before the process dies, so the report says where it happened."""
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # stderr replaced by an object without a file descriptor
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    args = build_parser().parse_args(argv)
    name = f"rtanon {args.command}"
    _report_native_crashes()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        forget_interrupts()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # run every `finally`: temporary files, devices,
            previous[sig] = signal.signal(sig, _raise_interrupted)  # children; SIGINT as Python's own, remembered
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted", file=sys.stderr)
        return 130
    except Interrupted as exc:
        print(f"\n{name}: stopped by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    except UserError as exc:
        if debug:
            traceback.print_exc()
        print(f"{name}: error: {printable(exc, ERROR_CHARS)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a file or folder the system refused: not a bug of rtanon
        if debug:
            traceback.print_exc()
        where = f" {printable(exc.filename)}:" if exc.filename else ""
        print(f"{name}: error:{where} {exc.strerror or exc}; check the path, its permissions and the free "
              "space", file=sys.stderr)
        return 2
    except Exception as exc:
        if debug:
            traceback.print_exc()
        module = (exc.name or "").split(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
        extra = extra_providing(module, args.command) if module else None
        if extra:  # an optional extra this command needs: a usage error
            print(f"{name}: error: {module} is not installed; it comes with the [{extra}] extra: "
                  f"{install_hint(extra)}", file=sys.stderr)
            return 2
        text = printable(" ".join(str(exc).split()), 300)
        print(f"{name}: internal error: {type(exc).__name__}: {text} (run again with --debug for the "
              "traceback, and report it)", file=sys.stderr)
        return 3
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
