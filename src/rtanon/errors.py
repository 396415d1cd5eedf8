"""The one base class for "the user asked for something impossible".

Every module raises its own subclass of :class:`UserError` (``AudioFileError``,
``ConfigError``, ``KaldiDirError``, ``BackendUnavailable``, ``VocoderMissing``,
``CliError``); the CLI prints any of them in one line, without a traceback,
and exits with its ``exit_code`` (2; ``RunFailed``: 1). ``Interrupted`` is
what the CLI's signal handlers raise on SIGTERM and SIGHUP, so every
``finally`` (temporary files, devices, child processes) runs. This module
imports nothing of rtanon, so any module may import it.
"""


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
