"""Exceptions that mean "the user asked for something impossible": the CLI
prints them in one line (no traceback) and exits with status 2."""

from rtanon.audio_io import AudioFileError
from rtanon.config import ConfigError
from rtanon.kaldi import KaldiDirError
from rtanon.neural.backends import BackendUnavailable
from rtanon.stages.neural import VocoderMissing


class CliError(Exception):
    """A bad command-line value or missing system piece; the message says what to do."""


USER_ERRORS: tuple[type[BaseException], ...] = (AudioFileError, ConfigError, KaldiDirError, CliError,
                                                BackendUnavailable, VocoderMissing)
