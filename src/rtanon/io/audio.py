"""Audio files in and out, streamed in constant memory.

``read_blocks(path)`` yields 16 kHz mono float32 blocks from any file
libsndfile reads (WAV, FLAC, OGG; any rate, channels and sample format),
downmixing and resampling on the way. ``AudioWriter`` writes blocks at the
input's rate through ``rtanon.atomic`` (a temporary file beside the target,
renamed into place only when everything succeeded), so a failed run never
leaves a half-written output and never touches the input.
"""

from __future__ import annotations

import os
import struct
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import soundfile as sf
import soxr

from rtanon.atomic import atomic_path, check_target
from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.errors import RunFailed, UserError, raise_if_interrupted
from rtanon.paths import check_regular

BLOCK_SECONDS = 2.0


class AudioFileError(UserError):
    """An input or output file cannot be used; the message says why."""


@dataclass(frozen=True)
class AudioInfo:
    path: Path
    sample_rate_hz: int
    channels: int
    frames: int
    subtype: str

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate_hz


def probe(path: str | os.PathLike) -> AudioInfo:
    """Reads the header of ``path``; raises AudioFileError with the reason."""
    path = Path(path)
    check_regular(path, "audio file")  # a FIFO would block, a device would never end
    if not path.exists():
        raise AudioFileError(f"{path}: no such file")
    if path.is_dir():
        raise AudioFileError(f"{path}: is a directory, expected an audio file")
    try:
        with _quiet_decoder(path):
            info = sf.info(str(path))
    except Exception as exc:  # libsndfile's messages are terse: add what we expected
        raise AudioFileError(f"{path}: not a readable audio file (WAV, FLAC, OGG...): {exc}") from None
    if info.frames == 0:
        raise AudioFileError(f"{path}: the file holds no audio frames")
    _check_complete(path)
    return AudioInfo(path, int(info.samplerate), int(info.channels), int(info.frames), info.subtype)


@contextmanager
def _quiet_decoder(path: Path) -> Iterator[None]:
    """Silences what libmpg123 writes straight to file descriptor 2 while an
    MP3 opens ("Xing stream size off...": rtanon's own message says what is
    wrong, in one line)."""
    if path.suffix.lower() != ".mp3":
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _check_complete(path: Path) -> None:
    """Raises AudioFileError when a WAV or Ogg file ends before its data does.
    libsndfile shortens such files silently (it trusts the file size over a
    WAV header, and takes an Ogg file's length from its last page); a FLAC or
    MP3 length header is checked against what decodes in ``read_blocks``."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(12)
        if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
            pos = 12
            while pos + 8 <= size:
                f.seek(pos)
                chunk_id, length = f.read(4), struct.unpack("<I", f.read(4))[0]
                if chunk_id == b"data":
                    if length not in (0, 0xFFFFFFFF) and pos + 8 + length > size:  # 0/-1: written while streaming
                        raise AudioFileError(f"{path}: truncated: the WAV header announces {length} bytes of audio, "
                                             f"the file holds {size - pos - 8}; use the complete file")
                    return
                pos += 8 + length + (length & 1)
        elif head[:4] == b"OggS":
            f.seek(max(0, size - 70_000))  # an Ogg page is at most 65 307 bytes
            tail_start = f.tell()
            tail = f.read()
            at = tail.rfind(b"OggS")
            while at >= 0:
                page = tail[at:]
                if len(page) >= 27 and len(page) >= 27 + page[26]:
                    end = at + 27 + page[26] + sum(page[27 : 27 + page[26]])
                    if end == len(tail):  # the last page ends exactly at the end of the file
                        if not page[5] & 0x04:
                            break
                        return
                at = tail.rfind(b"OggS", 0, at)
            raise AudioFileError(f"{path}: truncated: the Ogg stream stops before its last page "
                                 f"(at byte {tail_start + len(tail)}); use the complete file")


def read_blocks(path: str | os.PathLike, block_seconds: float = BLOCK_SECONDS) -> Iterator[np.ndarray]:
    """Yields the file as 16 kHz mono float32 blocks in [-1, 1].

    Channels are averaged; non-finite samples become 0; other rates are
    resampled with a streaming soxr resampler. A file that ends early (a
    truncated download) raises AudioFileError.
    """
    info = probe(path)
    resampler = None
    if info.sample_rate_hz != SAMPLE_RATE_HZ:
        resampler = soxr.ResampleStream(info.sample_rate_hz, SAMPLE_RATE_HZ, 1, dtype="float32")
    block_frames = max(1, int(block_seconds * info.sample_rate_hz))
    got = 0
    try:
        with _quiet_decoder(info.path):
            f = sf.SoundFile(str(info.path))
        with f:
            while True:  # not SoundFile.blocks: it pads a short MP3 read with stale samples
                raise_if_interrupted()
                block = f.read(block_frames, dtype="float32", always_2d=True)
                if not block.shape[0]:
                    break
                got += block.shape[0]
                mono = block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0]
                mono = np.nan_to_num(mono, nan=0.0, posinf=1.0, neginf=-1.0)
                mono = np.clip(mono, -1.0, 1.0)
                yield resampler.resample_chunk(mono) if resampler else mono
    except sf.LibsndfileError as exc:
        raise AudioFileError(f"{info.path}: unreadable audio data: {exc}") from None
    if resampler is not None:
        yield resampler.resample_chunk(np.zeros(0, np.float32), last=True)
    if got < info.frames:
        raise AudioFileError(f"{info.path}: truncated: header says {info.frames} frames, read {got}; "
                             "use the complete file")


def read_audio(path: str | os.PathLike) -> np.ndarray:
    """Whole file as 16 kHz mono float32 (for short files; see read_blocks)."""
    blocks = list(read_blocks(path))
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)


class AudioWriter:
    """Writes mono float32 blocks given at 16 kHz to ``path`` at
    ``sample_rate_hz`` (resampled on the way), atomically.

    Use as a context manager; the file appears under its final name only if
    the block exits without an exception. The format follows the extension
    (``.wav`` 16-bit PCM, ``.flac``, ``.ogg``).
    """

    def __init__(self, path: str | os.PathLike, sample_rate_hz: int = SAMPLE_RATE_HZ,
                 frames: int | None = None) -> None:
        self.path = Path(path)
        self.sample_rate_hz = int(sample_rate_hz)
        self._frames = frames  # exact output length, when known
        self._format = _output_format(self.path)
        self._resampler = None
        if self.sample_rate_hz != SAMPLE_RATE_HZ:
            self._resampler = soxr.ResampleStream(SAMPLE_RATE_HZ, self.sample_rate_hz, 1, dtype="float32")
        self.frames_written = 0

    def __enter__(self) -> "AudioWriter":
        check_output(self.path)
        subtype = _SUBTYPES.get(self._format)
        self._stack = ExitStack()
        tmp = self._stack.enter_context(atomic_path(self.path))
        try:
            try:
                self._file = self._stack.enter_context(
                    sf.SoundFile(tmp, "w", self.sample_rate_hz, 1, subtype=subtype, format=self._format))
            except (sf.LibsndfileError, OSError) as exc:
                raise AudioFileError(f"{self.path}: cannot write {self._format} at {self.sample_rate_hz} Hz: "
                                     f"{exc}; try .wav or .flac, and check the free space") from None
        except BaseException as exc:
            self._stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def write(self, block: np.ndarray) -> None:
        """Appends a block of 16 kHz mono float32 samples."""
        if self._resampler is not None:
            block = self._resampler.resample_chunk(np.ascontiguousarray(block, np.float32))
        self._write(block)

    def _write(self, block: np.ndarray) -> None:
        if self._frames is not None:
            block = block[: max(0, self._frames - self.frames_written)]
        try:
            self._file.write(np.clip(block, -1.0, 1.0))
        except (sf.LibsndfileError, OSError, AssertionError) as exc:  # soundfile asserts on a short write
            why = str(exc) or "short write"
            raise AudioFileError(f"{self.path}: writing failed after {self.frames_written} frames ({why}): "
                                 "is the disk full?") from None
        self.frames_written += block.shape[0]

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                if self._resampler is not None:
                    self._write(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
                if self._frames is not None and self.frames_written < self._frames:
                    self._write(np.zeros(self._frames - self.frames_written, np.float32))
            except BaseException as e:
                if not self._stack.__exit__(type(e), e, e.__traceback__):
                    raise
                return
        self._stack.__exit__(exc_type, exc, tb)  # closes the file, then renames or removes it


_SUBTYPES = {"WAV": "PCM_16", "FLAC": "PCM_16"}


def _output_format(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt.upper() not in sf.available_formats():
        raise AudioFileError(f"{path}: unknown output format {fmt!r}; use .wav, .flac, .ogg or .mp3")
    return fmt.upper()


def check_output(path: str | os.PathLike, src: str | os.PathLike | None = None) -> None:
    """Raises AudioFileError (or the atomic writer's OutputPathError) when ``path`` cannot be written as
    an audio file: an unknown extension, a missing folder, a target that is no regular file (a FIFO,
    ``/dev/null``), or the input ``src`` itself. Cheap: commands call it before any model loads."""
    path = Path(path)
    fmt = _output_format(path)
    if not sf.check_format(fmt, _SUBTYPES.get(fmt)):
        raise AudioFileError(f"{path}: libsndfile cannot write {fmt} here")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise AudioFileError(f"{path}: folder {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise AudioFileError(f"{path}: folder {directory} is not writable (read-only or not yours); name another")
    if src is not None and path.resolve() == Path(src).resolve():
        raise AudioFileError(f"{path}: output would overwrite the input; choose another path")
    check_target(path)


def anonymize_file(session, src: str | os.PathLike, dst: str | os.PathLike, progress=None) -> AudioInfo:
    """Runs ``src`` through ``session`` chunk by chunk, exactly as the live path
    would (minus its delay), and writes ``dst`` atomically at ``src``'s sample
    rate, mono, with the same number of frames. ``progress(seconds)`` is called
    per block when given. Returns the input's AudioInfo. When every chunk
    failed (the output would be comfort noise only) it raises RunFailed and
    writes nothing."""
    info = probe(src)
    check_output(dst, info.path)

    def blocks():
        for block in read_blocks(src):
            yield block
            if progress is not None:
                progress(block.shape[0] / SAMPLE_RATE_HZ)

    with AudioWriter(dst, info.sample_rate_hz, frames=info.frames) as writer:
        for out in session.iter_process(blocks()):
            writer.write(out)
        c = session.counters
        if c.nothing_rendered:
            raise RunFailed(f"{dst} not written: no chunk was anonymized, {c.stage_errors} of the {c.chunks} "
                            f"failed ({c.last_error})")
    return info
