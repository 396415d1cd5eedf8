"""The one base class for "the user asked for something impossible".

Every module raises its own subclass of :class:`UserError` (``AudioFileError``,
``ConfigError``, ``KaldiDirError``, ``BackendUnavailable``, ``VocoderMissing``,
``CliError``); the CLI prints any of them in one line, without a traceback,
and exits with status 2. This module imports nothing of rtanon, so any module
may import it.
"""


class UserError(Exception):
    """A request that cannot be carried out as given; the message says what to do."""


class CliError(UserError):
    """A bad command-line value or missing system piece; the message says what to do."""
