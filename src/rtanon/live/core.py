"""The real-time loop: PortAudio callbacks that only copy, a worker that processes.

``LiveCore`` is the device-independent heart, testable without a sound card:
``on_input(samples)`` (input callback) copies captured audio into a native
ring buffer; ``on_output(out)`` (output callback) copies processed audio
out of the other ring buffer and, when the worker is late, fills the gap with
comfort noise and counts a missed deadline. It never copies input to output.
A worker thread moves audio between the two through the ``Session``,
resampling device rates to 16 kHz and back with streaming soxr resamplers.

``rtanon.live.loop.run_live`` opens the PortAudio streams around it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import soxr

from rtanon.config import SAMPLE_RATE_HZ
from rtanon.engine import Session
from rtanon.live.config import LiveConfig
from rtanon.live.output import _OutputPath
from rtanon.live.recent import RecentValues
from rtanon.live.ring_buffer import RingBuffer

#: what a user can do when compute cannot keep up (the status line, --json-status, the control page)
OVERLOAD_FIXES = ("use --method mcadams, a larger --chunk-ms, or close what else keeps the CPU busy "
                  "(fewer threads elsewhere)")
OVERLOAD_FIXES_MCADAMS = "use a larger --chunk-ms, or close what else keeps the CPU busy (fewer threads elsewhere)"


class LiveCore:
    """Ring buffers + worker between an input and an output callback.

    Controls for a live UI, safe to use while audio runs: ``muted`` (the
    output callbacks play comfort noise from their next block on);
    ``replace_session(session, at_pause)`` (the worker swaps sessions between
    two input blocks, at once or, with ``at_pause``, once the current one's
    gate is closed, so a word is never cut); ``set_monitor(rate)`` (a second
    output, e.g. headphones, that plays the same anonymized audio through
    ``on_monitor``)."""

    def __init__(self, session: Session, in_rate_hz: int, out_rate_hz: int,
                 config: LiveConfig | None = None) -> None:
        self.config = config or LiveConfig()
        self.config.validate()
        if getattr(session, "anonymizer", None) is not None:  # a remote session renders elsewhere
            session.anonymizer.check_streams()  # a whole-utterance content encoder cannot stream
        self.session = session
        self.in_rate_hz, self.out_rate_hz = int(in_rate_hz), int(out_rate_hz)
        self._in_ring = RingBuffer(2 * self.in_rate_hz)
        q = self.config.resampler_quality
        self._to16 = (soxr.ResampleStream(self.in_rate_hz, SAMPLE_RATE_HZ, 1, dtype="float32", quality=q)
                      if self.in_rate_hz != SAMPLE_RATE_HZ else None)
        self._out = _OutputPath(session, self.out_rate_hz, self.config)
        self._monitor: _OutputPath | None = None
        self._pending = np.zeros(0, np.float32)
        self._next_session: tuple[Session, bool] | None = None
        self.muted = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        self.level_dbfs = -120.0
        self.drift_trims = 0
        self.input_skips = 0
        self.worker_errors = 0
        self.session_swaps = 0
        self.compute_ms = RecentValues()  # the worker's time per chunk (the session's stages)
        self.overload_drops = 0  # chunks of pauses dropped unrendered to keep the delay within overload_ms
        self.interrupted = False  # run_live: Ctrl-C ended the loop

    # -- callbacks: copies only ------------------------------------------------
    def on_input(self, samples: np.ndarray) -> None:
        """Input callback body: ``samples`` 1-D float32 at ``in_rate_hz``."""
        if self._in_ring.write(samples) < samples.shape[0]:
            self.session.counters.input_overflows += 1
        self._wake.set()

    def on_output(self, out: np.ndarray) -> None:
        """Output callback body: fills all of ``out`` (1-D float32 at ``out_rate_hz``)."""
        if not self._out.play(out, self.muted):
            self.session.counters.missed_deadlines += 1

    def on_monitor(self, out: np.ndarray) -> None:
        """Monitor callback body: the same audio as ``on_output``, at the monitor's rate."""
        monitor = self._monitor
        if monitor is None:
            out[:] = 0.0
        else:
            monitor.play(out, self.muted)

    # -- controls ----------------------------------------------------------------
    def set_monitor(self, rate_hz: int | None) -> None:
        """Starts (a rate) or stops (None) feeding a monitor output."""
        self._monitor = None if rate_hz is None else _OutputPath(self.session, rate_hz, self.config)

    def replace_session(self, session: Session, at_pause: bool = False) -> None:
        """Makes the worker continue with ``session`` (its counters become the old ones)."""
        self._next_session = (session, at_pause)

    @property
    def session_pending(self) -> bool:
        return self._next_session is not None

    @property
    def next_session(self) -> Session | None:
        """The session asked for and not swapped in yet."""
        nxt = self._next_session
        return None if nxt is None else nxt[0]

    @property
    def out_level_dbfs(self) -> float:
        return 10.0 * float(np.log10(max(self._out.mean_square, 1e-12)))

    # -- worker -----------------------------------------------------------------
    def start(self) -> None:
        anonymizer = getattr(self.session, "anonymizer", None)  # a remote session (rtanon connect) has none here
        if anonymizer is not None:
            anonymizer.warm_up()
        self._worker = threading.Thread(target=self._run, name="rtanon-worker", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout=5)

    @property
    def input_backlog(self) -> int:
        """Captured samples the worker has not taken yet."""
        return self._in_ring.readable

    @property
    def last_output_at(self) -> float:
        """When the output callback last ran (monotonic; the core's creation before it ever did)."""
        return self._out.last_read_at

    @property
    def queued_ms(self) -> float:
        return 1000.0 * self._out.ring.readable / self.out_rate_hz

    @property
    def queue_waits(self) -> RecentValues:
        """How long processed audio waited in the output queue (jitter buffer included), chunk by chunk:
        what was queued ahead of each chunk's output when it arrived, in ms."""
        return self._out.queue_at_push_ms

    @property
    def queue_wait_ms(self) -> float | None:
        """The median wait of late (``queue_waits``); None before audio flowed."""
        return self._out.queue_at_push_ms.percentile(50)

    @property
    def overloaded(self) -> bool:
        """Whether compute falls behind real time: the median time per chunk of the last 25 chunks (half
        a second at 20 ms) exceeds the chunk's duration."""
        recent = self.compute_ms.percentile(50, since=self.compute_ms.count - 25)
        chunk_ms = 1000.0 * self.session.chunk_samples / SAMPLE_RATE_HZ
        return recent is not None and recent > chunk_ms

    def overload_note(self) -> str | None:
        """What the status line, ``--json-status`` and the control page say while overloaded: the
        figures, and the fixes; None while compute keeps up."""
        if not self.overloaded:
            return None
        chunk_ms = 1000.0 * self.session.chunk_samples / SAMPLE_RATE_HZ
        compute = self.compute_ms.percentile(50, since=self.compute_ms.count - 25)
        config = getattr(getattr(self.session, "anonymizer", None), "config", None)  # a remote session: none
        fixes = OVERLOAD_FIXES_MCADAMS if getattr(config, "method", None) == "mcadams" else OVERLOAD_FIXES
        return (f"overloaded: {compute:.0f} ms of compute per {chunk_ms:.0f} ms chunk, pauses dropped to "
                f"keep the delay; {fixes}")

    def pipeline_ms(self) -> float:
        """rtanon's own delay beyond the algorithmic one: the worker's compute per chunk plus the output
        queue's wait (medians of late; the queue as it stands before audio flowed)."""
        wait = self.queue_wait_ms
        return (self.compute_ms.percentile(50) or 0.0) + (self.queued_ms if wait is None else wait)

    def _run(self) -> None:
        block = max(1, self.in_rate_hz * self.config.block_ms // 1000)
        while not self._stop.is_set():
            self._wake.wait(timeout=0.05)
            self._wake.clear()
            while self._in_ring.readable >= block and not self._stop.is_set():
                backlog = self._in_ring.readable - self.in_rate_hz * self.config.max_queue_ms // 1000
                if backlog > 0:  # far behind real time: skip ahead rather than grow the delay
                    self._in_ring.discard(backlog)
                    self.input_skips += 1
                x = self._in_ring.read(self._in_ring.readable)
                try:
                    self._swap_session()
                    self._process(x, self.session.chunk_samples)
                except Exception as exc:  # the output callback keeps playing comfort noise
                    self.worker_errors += 1
                    self.session.counters.last_error = f"worker: {type(exc).__name__}: {exc}"

    def _swap_session(self) -> None:
        nxt = self._next_session
        if nxt is None or (nxt[1] and self.session.last_speech):
            return
        session, _ = nxt
        session.counters = self.session.counters
        self.session = session  # its gate starts closed: comfort noise until it hears speech
        self._next_session = None
        self.session_swaps += 1

    def _process(self, x: np.ndarray, chunk: int) -> None:
        rms = float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0
        self.level_dbfs = 20.0 * np.log10(max(rms, 1e-6))
        x16 = self._to16.resample_chunk(x) if self._to16 is not None else x
        pending = np.concatenate((self._pending, x16))
        usable = pending.shape[0] // chunk * chunk
        self._pending = pending[usable:]
        if not usable:
            return
        outs, speech = [], False
        # audio behind real time: captured and not rendered yet, and rendered and not played yet
        behind = (self._in_ring.readable * SAMPLE_RATE_HZ // self.in_rate_hz + pending.shape[0]
                  + self._out.ring.readable * SAMPLE_RATE_HZ // self.out_rate_hz)
        limit = SAMPLE_RATE_HZ * self.config.overload_ms // 1000
        drop_if_pause = getattr(self.session, "drop_if_pause", None)  # a remote session renders elsewhere
        for c in pending[:usable].reshape(-1, chunk):
            if behind - chunk >= limit and drop_if_pause is not None and drop_if_pause(c):  # late: a pause
                self.overload_drops += 1
                behind -= chunk
                for path in (self._out, self._monitor):
                    if path is not None:
                        path.dropped(chunk)
                continue
            t0 = time.perf_counter()
            outs.append(self.session.process(c))
            self.compute_ms.add(1000.0 * (time.perf_counter() - t0))
            speech = speech or self.session.last_speech
        if not outs:
            return
        y = np.concatenate(outs)
        self.drift_trims += self._out.push(y, speech)
        monitor = self._monitor
        if monitor is not None:
            monitor.push(y, speech)
