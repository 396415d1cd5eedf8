"""Paths rtanon reads: only regular files, read to a bounded size, and named safely.

``check_regular(path, what)`` refuses a device, FIFO or socket where a file is expected (reading
``/dev/zero`` never ends, opening a FIFO blocks until a writer comes); ``read_capped(path, max_bytes, what)``
reads a small file (an identity, settings) whole, refusing one that is not regular or is too large;
``special_kind(mode)`` names what a non-regular file is; ``printable(text)`` makes untrusted text (a field
of a file, a path from a list) safe for one terminal line: control characters escaped, long text cut.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rtanon.errors import UserError

#: How much of an untrusted text ``printable`` shows.
PRINTABLE_CHARS = 200


class InputPathError(UserError):
    """An input path that is not a regular file, or a file too large for what it should hold."""


def special_kind(mode: int) -> str | None:
    """None for a regular file or a folder; otherwise what the file is ("FIFO", "character device"...)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return {stat.S_IFCHR: "character device", stat.S_IFBLK: "block device", stat.S_IFIFO: "FIFO",
            stat.S_IFSOCK: "socket"}.get(stat.S_IFMT(mode), "special file")


def check_regular(path: str | os.PathLike, what: str = "file") -> None:
    """Raises InputPathError when ``path`` exists and is a device, FIFO or socket (a missing path or a
    folder is left to the caller, which says so in its own words)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # a symlink loop, a name too long
        raise InputPathError(f"{printable(path)}: cannot be read ({exc.strerror}); give a regular {what}") from None
    if kind := special_kind(mode):
        raise InputPathError(f"{printable(path)}: is a {kind}, not a regular file; give a regular {what}")


def read_capped(path: str | os.PathLike, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``; InputPathError when it is not one or holds more than
    ``max_bytes``. The file is opened without blocking, so a FIFO is refused instead of waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if kind := special_kind(os.fstat(fd).st_mode):
            raise InputPathError(f"{printable(path)}: is a {kind}, not a regular file; give a regular {what}")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputPathError(f"{printable(path)}: larger than {max_bytes} bytes, too large for a {what}")
    return data


def printable(text, limit: int = PRINTABLE_CHARS) -> str:
    """``text`` (any object, a path included) as one safe terminal line: control and other non-printable
    characters as Python escapes, cut to ``limit`` characters with the length said."""
    text = os.fsdecode(text) if isinstance(text, (bytes, Path)) else str(text)
    safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return safe if len(text) <= limit else f"{safe[:limit]}... ({len(text)} characters)"
