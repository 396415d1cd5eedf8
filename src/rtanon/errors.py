"""The one base class for "the user asked for something impossible".

Every module raises its own subclass of :class:`UserError` (``AudioFileError``,
``ConfigError``, ``KaldiDirError``, ``BackendUnavailable``, ``VocoderMissing``,
``CliError``); the CLI prints any of them in one line, without a traceback,
and exits with its ``exit_code`` (2; ``RunFailed``: 1). ``Interrupted`` is
what the CLI's signal handlers raise on SIGTERM and SIGHUP, so every
``finally`` (temporary files, devices, child processes) runs; a signal that
lands where an exception does harm (a destructor, Numba's compiler) is only
remembered, and ``raise_if_interrupted`` raises it at the next block of audio.
This module imports nothing of rtanon, so any module may import it.
"""

import signal
import sys
from pathlib import Path


def install_hint(extra: str) -> str:
    """The command that installs rtanon's ``[extra]`` here: ``setup.sh`` in the checkout whose ``.venv`` runs
    this, else pip from the source folder (rtanon is not on a package index, so ``pip install
    'rtanon[extra]'`` fails)."""
    checkout = Path(sys.prefix).resolve().parent
    if (checkout / "setup.sh").is_file() and (checkout / "pyproject.toml").is_file():
        return f"cd {checkout} && RTANON_EXTRAS={extra} ./setup.sh"
    return f"pip install '.[{extra}]' in the rtanon source folder"


class UserError(Exception):
    """A request that cannot be carried out as given; the message says what to do."""

    exit_code = 2


class CliError(UserError):
    """A bad command-line value or missing system piece; the message says what to do."""


class RunFailed(UserError):
    """The input was fine but the run could not produce a real result (every chunk failed)."""

    exit_code = 1


class Interrupted(BaseException):
    """A termination signal (SIGTERM, SIGHUP) turned into an exception; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


_signals: list[int] = []  # the signals the CLI's handlers turned into exceptions, this run


def interrupt(signum: int, frame=None) -> None:
    """Raises what signal ``signum`` asks for (KeyboardInterrupt for SIGINT, else Interrupted), and
    remembers it for ``raise_if_interrupted``. Where ``frame`` (the signal handler's) is somewhere an
    exception does harm, it only remembers, and the next block of audio raises it:

    - inside a destructor: Python would swallow the exception there, and the destructor, cut short, leaves
      its object half torn down (a CI run: llvmlite's ``ObjectRef`` lost an attribute and printed a
      traceback at exit);
    - inside Numba's or llvmlite's Python code (a kernel compiled or loaded from the cache on its first
      call): an exception in llvmlite's ctypes callbacks or between its lock and its release leaves LLVM
      half way, and the process died of a segmentation fault (CI, and 2 of 27 runs under load)."""
    _signals.append(signum)
    if _unsafe_to_raise(frame):
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signum)


_NATIVE_COMPILERS = frozenset({"numba", "llvmlite"})


def _unsafe_to_raise(frame, depth: int = 64) -> bool:
    while frame is not None and depth > 0:
        code = frame.f_code
        if code.co_name == "__del__" or not _NATIVE_COMPILERS.isdisjoint(Path(code.co_filename).parts):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def raise_if_interrupted() -> None:
    """Raises again a signal's exception that was swallowed: one raised while a destructor ran (numba's
    llvmlite objects are collected mid-run) is printed as "Exception ignored" and lost, and the run went
    on to the end (a CI run: `rtanon file` finished its 600 s after Ctrl-C). Long loops call it."""
    if _signals:
        interrupt(_signals[0])


def forget_interrupts() -> None:
    _signals.clear()
