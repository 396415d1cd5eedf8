"""The server's tick: every session's frames stepped together, each answered by its deadline.

:class:`Scheduler` runs in one thread. Every ``tick_ms`` it takes the frames that have arrived from
every session (oldest first) and steps the sessions as one batch per round
(:func:`rtanon.batch.run_batched`: the content encoder, the vocoder, the McAdams frames, the
all-pass and the pass-through guard each run as one call for all sessions). A frame is answered
with the session's output if that is ready by the frame's deadline (``deadline_ms`` after it
arrived); otherwise, and while the session is muted, with comfort noise, never with its input. A
frame that is already past its deadline when its turn comes is not computed at all, so a server
that falls behind catches up instead of drifting. Sessions join and leave at any tick.

On a CPU the batched calls of the content encoder, the vocoder and the McAdams frames are cut into one
part per worker thread (``ServeConfig.workers``, :class:`rtanon.batch.Workers`) and run at once; the
sessions' own Python stays on the scheduler's thread.

Every per-session rule of the engine holds: a stage that fails, raises or returns non-finite audio
gives that session comfort noise (``Session.steps``); a failing batched call is retried row by row
so the others never notice.
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from rtanon.batch import Failed, Workers, run_batched
from rtanon.config import ConfigError
from rtanon.constants import FRAME_SAMPLES, SAMPLE_RATE_HZ


def default_workers(cores: float | None = None) -> int:
    """Worker threads for ``cores`` (default: the cores this process may use), at most 8: a server's
    batched calls past that are better batched."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, round(cores)))


@dataclass
class ServeConfig:
    """``max_sessions``: connections served at once (more are refused); ``tick_ms``: the scheduler's
    period (one frame); ``deadline_ms``: how long after its arrival a frame may be answered with the
    session's voice (later: comfort noise, counted as missed); ``max_queued_frames``: frames a session
    may have waiting (a client sending faster than real time is closed before); ``burst_frames``: how
    far ahead of real time a client may send before it counts as flooding; ``workers``: threads that
    run parts of a batched call at once (default: the cores this process may use, at most 8)."""

    max_sessions: int = 64
    tick_ms: int = FRAME_SAMPLES * 1000 // SAMPLE_RATE_HZ
    deadline_ms: int = 60
    max_queued_frames: int = 25
    burst_frames: int = 25
    workers: int = field(default_factory=default_workers)

    def validate(self) -> None:
        if not 1 <= self.max_sessions <= 100_000:
            raise ConfigError(f"max_sessions={self.max_sessions}: use 1 to 100000")
        if self.tick_ms != FRAME_SAMPLES * 1000 // SAMPLE_RATE_HZ:
            raise ConfigError(f"tick_ms={self.tick_ms}: the server ticks once per 20 ms frame")
        if not self.tick_ms <= self.deadline_ms <= 1000:
            raise ConfigError(f"deadline_ms={self.deadline_ms}: use {self.tick_ms} to 1000")
        if not 1 <= self.burst_frames <= self.max_queued_frames:
            raise ConfigError(f"burst_frames={self.burst_frames}: use 1 to max_queued_frames "
                              f"({self.max_queued_frames})")
        if not 1 <= self.workers <= 256:
            raise ConfigError(f"workers={self.workers}: use 1 to 256")


#: the GIL's switch interval a server asks for (Python's default: 5 ms): a worker whose ONNX Runtime call
#: has returned, or the network's thread, waits at most this long for the tick's thread to let go
SWITCH_INTERVAL_S = 0.0005


def realtime_process() -> None:
    """Process-wide settings of a server, called once its models are loaded (``rtanon serve``, a Ray
    replica): a short GIL switch interval (``SWITCH_INTERVAL_S``), and what is alive now moved out of the
    collector's reach (``gc.freeze``) so that a full collection does not walk the models' objects inside a
    tick. Measured on the 2-core VM, 8 neural sessions over loopback, 30 s: missed deadlines 5,996 -> 51."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    gc.collect()
    gc.freeze()


class StreamSession:
    """One connection's session: its engine ``Session`` (swapped for a new voice at a pause), the
    frames waiting for the next tick, and what happened to them. ``deliver`` is not called here:
    the scheduler hands every tick's answers to its ``on_output`` at once."""

    _ids = itertools.count(1)

    def __init__(self, session, label: str = "") -> None:
        self.id = next(self._ids)
        self.label = label
        self.session = session
        self.queue: collections.deque = collections.deque()  # (seq, arrival monotonic s, samples)
        self.muted = False
        self.next_session = None  # a new voice, swapped in when the current one is silent
        self.frames_in = 0
        self.frames_out = 0
        self.missed = 0  # frames answered with comfort noise because they were late
        self.dropped = 0  # frames dropped from a full queue (also answered with comfort noise)
        self.voice_changes = 0
        self._was_muted = False

    def stats(self) -> dict:
        c = self.session.counters
        return {"session": self.id, "frames_in": self.frames_in, "frames_out": self.frames_out,
                "missed_deadlines": self.missed, "dropped": self.dropped, "speech_frames": c.speech_chunks,
                "stage_errors": c.stage_errors, "muted": self.muted, "voice_changes": self.voice_changes}


class TickStats:
    """Compute time and batch size of the last ``window`` ticks that had work, and counts since the start."""

    def __init__(self, window: int = 3000) -> None:
        self.compute_s: collections.deque = collections.deque(maxlen=window)
        self.batch: collections.deque = collections.deque(maxlen=window)
        self.ticks = 0
        self.overruns = 0  # ticks whose work took longer than a tick

    def add(self, seconds: float, batch: int, period_s: float) -> None:
        self.ticks += 1
        self.compute_s.append(seconds)
        self.batch.append(batch)
        self.overruns += seconds > period_s

    def summary(self) -> dict:
        ms = np.asarray(self.compute_s) * 1e3
        return {"ticks": self.ticks, "overruns": self.overruns,
                "compute_ms_p50": round(float(np.percentile(ms, 50)), 3) if ms.size else None,
                "compute_ms_p99": round(float(np.percentile(ms, 99)), 3) if ms.size else None,
                "batch_mean": round(float(np.mean(self.batch)), 2) if self.batch else None}


Output = tuple[StreamSession, int, np.ndarray]


class Scheduler:
    """Steps every session once per tick, batched (see the module docstring). ``on_output`` gets each
    tick's answers, ``[(stream, seq, float32 samples)]``, from the scheduler's thread."""

    def __init__(self, config: ServeConfig, on_output: Callable[[list[Output]], None]) -> None:
        config.validate()
        self.config = config
        self.on_output = on_output
        self.stats = TickStats()
        self.calls: dict = {}  # batched calls and rows by runner (rows / calls = the mean batch)
        self.workers = Workers(config.workers)
        self._lock = threading.Lock()
        self._streams: dict[int, StreamSession] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sessions (any thread) --------------------------------------------------------------------
    def add(self, stream: StreamSession) -> None:
        with self._lock:
            self._streams[stream.id] = stream

    def remove(self, stream: StreamSession) -> None:
        with self._lock:
            self._streams.pop(stream.id, None)
            stream.queue.clear()

    def __len__(self) -> int:
        return len(self._streams)

    def push(self, stream: StreamSession, seq: int, samples: np.ndarray) -> None:
        """Queues one frame for the next tick (a full queue drops its oldest frame, which is answered
        with comfort noise at that tick)."""
        with self._lock:
            stream.frames_in += 1
            stream.queue.append((seq, time.monotonic(), samples))

    # -- the tick ---------------------------------------------------------------------------------
    def step(self) -> list[Output]:
        """One tick's work: every queued frame of every session answered (the scheduler thread, or a test)."""
        deadline = self.config.deadline_ms / 1000.0
        with self._lock:
            work = []
            for stream in self._streams.values():
                if stream.queue:
                    frames = list(stream.queue)
                    stream.queue.clear()
                    work.append((stream, frames))
        outputs: list[Output] = []
        for r in range(max((len(f) for _, f in work), default=0)):
            now = time.monotonic()
            batch = []
            for stream, frames in work:
                if r >= len(frames):
                    continue
                seq, arrived, x = frames[r]
                drop = len(frames) - r > self.config.max_queued_frames
                if stream.muted or drop or now - arrived > deadline:
                    stream.missed += not stream.muted and not drop
                    stream.dropped += drop
                    stream._was_muted |= stream.muted
                    outputs.append((stream, seq, stream.session.comfort_noise(x.shape[0])))
                    continue
                self._prepare(stream)
                batch.append((stream, seq, arrived, x))
            if not batch:
                continue
            results = run_batched([s.session.steps(x) for s, _, _, x in batch], self.calls, self.workers)
            done = time.monotonic()
            for (stream, seq, arrived, x), y in zip(batch, results):
                if isinstance(y, Failed) or done - arrived > deadline:
                    stream.missed += not isinstance(y, Failed)
                    y = stream.session.comfort_noise(x.shape[0])
                outputs.append((stream, seq, y))
        for stream, _, _ in outputs:
            stream.frames_out += 1
        return outputs

    @staticmethod
    def _prepare(stream: StreamSession) -> None:
        """Before a session's frame: a new voice takes over at a pause; after a mute the stream starts afresh."""
        if stream.next_session is not None and not stream.session.last_speech:
            stream.session, stream.next_session = stream.next_session, None
            stream.voice_changes += 1
        if stream._was_muted:
            stream.session.reset()
            stream._was_muted = False

    def run(self) -> None:
        """Ticks until :meth:`stop` (the scheduler thread's body)."""
        period = self.config.tick_ms / 1000.0
        t_next = time.monotonic()
        while not self._stop.is_set():
            t_next += period
            wait = t_next - time.monotonic()
            if wait > 0:
                self._stop.wait(wait)
            elif wait < -period:  # fell more than a tick behind: tick now, do not burst to catch up
                t_next = time.monotonic()
            t0 = time.perf_counter()
            outputs = self.step()
            if outputs:
                self.stats.add(time.perf_counter() - t0, len(outputs), period)
                self.on_output(outputs)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="rtanon-serve-tick", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                return  # a tick still running keeps its workers
        self.workers.close()
