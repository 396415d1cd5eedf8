"""The local Ray's watchdog: a small process that outlives the driver and ends what Ray leaves when it dies.

Ray ties its GCS and raylet to the driver that started them (the kernel kills them with it), but the
raylet's dashboard and runtime-env agents, on losing it, report to the dead GCS and wait about a minute
for it before they exit; a driver killed with SIGKILL cannot end them itself. So ``on_ray.start_ray``
starts this watchdog right after it started a local Ray (:func:`start`, in a session of its own, so that a
signal to the driver's process group spares it), naming the processes ``ray.init`` started.

The watchdog records those processes and every descendant they start (the agents, the workers) by PID and
start time, every ``POLL_S``. Its standard input is a pipe from the driver. :func:`stop` (after
``ray.shutdown``) writes ``done`` and the watchdog exits, killing nothing. End of file with no ``done`` means
the driver died (the kernel closes the pipe, also after SIGKILL): the watchdog stops every recorded process
that is still the same process (SIGSTOP, so none starts another), records what they started meanwhile,
kills them all (SIGKILL) and exits. A driver that cannot shut Ray down (a signal to its process group ended
Ray's GCS too) closes the pipe itself and waits for that (:func:`end`).

Linux only (``/proc``; :func:`supported`); standard library only: the watchdog runs this file's :func:`main`
in ``python -I`` (``_RUN``), importing nothing of rtanon, and is no command of its own.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

#: How often the watchdog records the descendants of Ray's processes.
POLL_S = 0.25
#: What the driver writes when it ended Ray itself.
DONE = b"done\n"
#: How long :func:`stop` waits for the watchdog to exit before it kills it.
STOP_WAIT_S = 5.0
#: The watchdog's program: ``python -I -c _RUN THIS_FILE PID:START...`` runs :func:`main` of this file.
_RUN = "import runpy, sys; sys.exit(runpy.run_path(sys.argv.pop(1))['main'](sys.argv[1:]))"


def supported() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks since boot) of process ``pid``; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold anything
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), int(fields[19])


def processes() -> dict[int, tuple[int, int]]:
    """PID -> (parent PID, start time) of every live process."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            table[int(name)] = st
    return table


def children(pid: int, table: dict[int, tuple[int, int]] | None = None) -> dict[int, int]:
    """PID -> start time of the live children of ``pid``."""
    table = processes() if table is None else table
    return {child: start for child, (parent, start) in table.items() if parent == pid}


def _record(known: dict[int, int]) -> None:
    """Drops from ``known`` (PID -> start time) what has ended and adds every live descendant of what remains."""
    table = processes()
    for pid, start in list(known.items()):
        if table.get(pid, (0, None))[1] != start:
            del known[pid]
    grew = True
    while grew:
        more = {pid: start for pid, (parent, start) in table.items() if parent in known and pid not in known}
        known.update(more)
        grew = bool(more)


def _signal(known: dict[int, int], pids, sig: int) -> None:
    for pid in pids:
        st = _stat(pid)
        if st is not None and st[1] == known[pid]:  # still the process recorded, not a new one with its PID
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def kill_all(known: dict[int, int]) -> None:
    """Stops every recorded process and its descendants until none is left to find, then kills them."""
    stopped: set[int] = set()
    _record(known)
    while set(known) - stopped:
        fresh = set(known) - stopped
        _signal(known, fresh, signal.SIGSTOP)
        stopped |= fresh
        _record(known)
    _signal(known, known, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """The watchdog over the processes ``argv`` names (``PID:START``), until its standard input says ``done``
    (exit, killing nothing) or ends (kill them and their descendants)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    known = {int(pid): int(start) for pid, _, start in (arg.partition(":") for arg in argv)}
    fd = sys.stdin.fileno()
    received = b""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            chunk = os.read(fd, 64)
            received += chunk
            if DONE in received:
                return 0
            if not chunk:  # the driver is gone without a word
                kill_all(known)
                return 0
        _record(known)


def start(pids: dict[int, int]) -> subprocess.Popen:
    """Starts the watchdog over ``pids`` (PID -> start time, as :func:`children` gives them)."""
    return subprocess.Popen([sys.executable, "-I", "-c", _RUN, os.path.abspath(__file__),
                             *(f"{pid}:{start}" for pid, start in pids.items())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(watchdog: subprocess.Popen) -> None:
    """Tells the watchdog that the driver ended Ray itself, and waits for it to exit."""
    try:
        watchdog.communicate(DONE, timeout=STOP_WAIT_S)
    except (OSError, subprocess.TimeoutExpired):
        watchdog.kill()
        watchdog.wait()


def end(watchdog: subprocess.Popen) -> None:
    """Has the watchdog kill every process it recorded, as if the driver had died, and waits (at most
    STOP_WAIT_S) until it has."""
    try:
        watchdog.stdin.close()
        watchdog.wait(timeout=STOP_WAIT_S)
    except (OSError, subprocess.TimeoutExpired):
        watchdog.kill()
        watchdog.wait()
