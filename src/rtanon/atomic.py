"""The one atomic file writer: a file appears under its final name complete,
or not at all.

Everything rtanon writes (audio, identities, pools, caches, checkpoints,
shards, engines, reports) goes through :func:`atomic_path` or
:func:`atomic_open`. The data goes to a hidden temporary file beside the
target, ``.NAME.PID.XXXXXXXX.part``, which replaces the target only when the
block exits without an exception and is removed otherwise (the CLI turns
SIGTERM and SIGHUP into an exception, so those clean up too). A process
killed with SIGKILL cannot clean up: the next write of the same name removes
the temporary files whose process is gone, and :func:`remove_leftovers`
sweeps a folder (only names of this pattern whose PID is gone).
:func:`check_target` refuses, before any work, a target the rename would
wrongly replace (a device, a FIFO, a socket) or whose temporary
name the file system cannot hold.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from rtanon.errors import UserError
from rtanon.paths import printable, special_kind

PART_SUFFIX = ".part"
#: What a temporary name adds to the target's: ``.`` NAME ``.`` PID (7 digits at most) ``.`` 8 random ``.part``.
_TEMP_EXTRA_BYTES = 1 + 1 + 7 + 1 + 8 + len(PART_SUFFIX)


class OutputPathError(UserError):
    """An output path that the atomic writer cannot or must not replace; the message says why."""


def check_target(path: str | os.PathLike) -> None:
    """Raises OutputPathError when writing ``path`` atomically would go wrong: it exists and is not a
    regular file or a folder (renaming over a device node or a FIFO would replace it with a regular file:
    ``/dev/null`` included), or its temporary name would be longer than the file system allows. A folder
    is left to the rename, which refuses it."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a symlink loop, a name too long...: say it in one line
        raise OutputPathError(f"{printable(path)}: cannot be used as an output ({exc.strerror}); name another "
                              "file") from None
    if mode is not None and (kind := special_kind(mode)):
        raise OutputPathError(f"{printable(path)}: is a {kind}, not a regular file; rtanon writes whole files "
                              "and would replace it: name a regular file")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(path.name)) + _TEMP_EXTRA_BYTES > name_max:
        raise OutputPathError(f"{printable(path)}: file name too long ({len(os.fsencode(path.name))} bytes; at most "
                              f"{name_max - _TEMP_EXTRA_BYTES} here, to leave room for the temporary name): "
                              "use a shorter name")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike, private: bool = False) -> Iterator[Path]:
    """Yields a temporary path to write in place of ``path``.

    On a clean exit the temporary file gets ordinary permissions (0666 less
    the umask; ``private``: 0600, its owner's alone) and replaces ``path``; on any exception it is removed and
    ``path`` is left as it was. The folder must exist; ``path`` must pass
    :func:`check_target` (checked again just before the rename).
    """
    path = Path(path)
    check_target(path)
    directory = path.parent if str(path.parent) else Path(".")
    remove_leftovers(directory, path.name)
    prefix = f".{path.name}.{os.getpid()}."
    tmp = None
    try:
        try:
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=PART_SUFFIX, dir=directory)
        except OSError as exc:  # name the file the user asked for, not the temporary one
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        os.close(fd)
        yield Path(tmp)
        if not private:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600
        check_target(path)  # a FIFO or device made while the data was written is not replaced either
        os.replace(tmp, path)
    finally:
        if tmp is None:  # a signal inside mkstemp, after it made the file: this process's name for it
            for leftover in directory.glob(glob.escape(prefix) + "*" + PART_SUFFIX):
                m = _TEMP_NAME.fullmatch(leftover.name)
                if m and m["name"] == path.name and int(m["pid"]) == os.getpid():
                    leftover.unlink(missing_ok=True)
        elif os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", private: bool = False, **kwargs) -> Iterator[IO]:
    """``open(path, mode)`` through :func:`atomic_path` (``mode`` ``"w"`` or
    ``"wb"``): the file object writes the temporary file."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path, private) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def write_text(path: str | os.PathLike, text: str, private: bool = False) -> None:
    """Writes ``text`` (UTF-8) to ``path`` atomically (``private``: mode 0600)."""
    with atomic_open(path, "w", private, encoding="utf-8") as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie not yet reaped counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's live process
        return True
    return True


#: A temporary name: ``.NAME.PID.RANDOM.part`` (RANDOM: what ``tempfile.mkstemp`` draws).
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.[a-z0-9_]+" + re.escape(PART_SUFFIX))


def remove_leftovers(directory: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Removes the temporary files that writers now gone (killed with SIGKILL, a power cut) left in
    ``directory`` (only ``name``'s when given) and returns them: names of rtanon's own pattern whose PID no
    longer runs. Anyone else's ``.*.part`` file, and a live writer's, stay. Best effort: an unreadable
    folder fails later, clearly."""
    pattern = f".{glob.escape(name)}.*{PART_SUFFIX}" if name else f".*{PART_SUFFIX}"
    removed = []
    try:
        for p in Path(directory).glob(pattern):
            m = _TEMP_NAME.fullmatch(p.name)
            if (m and (name is None or m["name"] == name) and not pid_alive(int(m["pid"]))
                    and p.is_file() and not p.is_symlink()):
                p.unlink(missing_ok=True)
                removed.append(p)
    except OSError:
        pass
    return removed
