"""Package data, loaded with importlib.resources (nothing is downloaded)."""

from __future__ import annotations

from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Iterator


@contextmanager
def demo_speech_path() -> Iterator[Path]:
    """Path to the embedded demo utterance (16 kHz mono FLAC, espeak-ng voice)."""
    with resources.as_file(resources.files("rtanon") / "data" / "demo_speech.flac") as p:
        yield p
