"""The real-time loop: PortAudio callbacks that only copy, a worker that processes.

``LiveCore`` is the device-independent heart, testable without a sound card:
``on_input(samples)`` (input callback) copies captured audio into a native
ring buffer; ``on_output(out)`` (output callback) copies processed audio
out of the other ring buffer and, when the worker is late, fills the gap with
comfort noise and counts a missed deadline. It never copies input to output.
A worker thread moves audio between the two through the ``Session``,
resampling device rates to 16 kHz and back with streaming soxr resamplers.

``run_live`` opens the PortAudio streams (python-sounddevice), prints a
one-line status, and stops cleanly on Ctrl-C.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import soxr

from rtanon.ring_buffer import RingBuffer
from rtanon.config import SAMPLE_RATE_HZ, ConfigError
from rtanon.engine import Session
from rtanon.methods import voice_sentence
from rtanon.pulse_stream import PulseStreamError


@dataclass(frozen=True)
class LiveConfig:
    """How the live loop queues processed audio for the output device (an adaptive jitter buffer).

    ``jitter_ms``: the margin of processed audio the output queue keeps after every output callback, at
    least; it grows by what was missing at each underflow (up to ``max_jitter_ms``) and shrinks back every
    ``steady_s`` without one, by half its excess over ``jitter_ms`` and at least ``jitter_step_ms``. What
    the queue held beyond the margin throughout the last ``window_s`` it gives back from the next
    non-speech output (comfort noise: never a word cut), up to all of it. ``max_queue_ms``: beyond this
    the queue is trimmed at once (clock drift between devices); ``block_ms``: the input device's callback
    size; ``out_block_ms``: the output device's (a smaller block hands queued audio over sooner);
    ``server_latency_ms``: the buffering rtanon asks the audio server for on its streams through
    PortAudio, the input (``server_latency``; 0: the server's default); ``out_latency_ms``: the buffer
    its output on libpulse asks for (``PulseOutputStream``; 0: the server's default);
    ``resampler_quality``: soxr quality for device rates other than 16 kHz (``"LQ"`` keeps its delay low).
    ``overload_ms``: the most audio rtanon's own queues hold (captured and not rendered yet, rendered and
    not played yet) once compute falls behind: beyond it the worker drops the chunks the gate finds no
    speech in, unrendered (pauses: never a word, never the raw voice); within one long utterance the
    queues may grow up to ``max_queue_ms``, and the next pause gives it back.

    The defaults come from ``rtanon bench --e2e`` on a 2-core machine (docs/lab-notes/live-delay.md):
    a 20 ms margin and the server's default buffering cost 40-50 ms more than 5 and 15 ms with no
    more missed deadlines; 5 ms output blocks with a 2 ms margin took another 6 ms off the neural voice
    on PulseAudio; 10 ms asked of the server (one input block) took 10-14 ms off on PipeWire against 15
    (5 and 7 ms: no gain there) and cost nothing on PulseAudio since the output runs on libpulse; a 5 ms
    output buffer, with pipewire-pulse's floors lowered for rtanon's streams, took 17-18 ms off on
    PipeWire and 5-6 on PulseAudio."""

    jitter_ms: int = 2
    max_jitter_ms: int = 80
    jitter_step_ms: int = 2
    steady_s: float = 10.0
    window_s: float = 1.0
    max_queue_ms: int = 200
    block_ms: int = 10
    out_block_ms: int = 5
    server_latency_ms: int = 10
    out_latency_ms: int = 5
    resampler_quality: str = "LQ"
    overload_ms: int = 60

    def validate(self) -> None:
        if not 0 <= self.jitter_ms <= self.max_jitter_ms <= 500:
            raise ConfigError(f"jitter_ms={self.jitter_ms}, max_jitter_ms={self.max_jitter_ms}; use "
                              "0 <= jitter_ms <= max_jitter_ms <= 500 ms")
        if not self.max_jitter_ms < self.max_queue_ms <= 2000:
            raise ConfigError(f"max_queue_ms={self.max_queue_ms}; use more than max_jitter_ms and at most 2000")
        if not (1 <= self.jitter_step_ms <= 50 and 0.2 <= self.window_s <= self.steady_s <= 600):
            raise ConfigError(f"jitter_step_ms={self.jitter_step_ms}, window_s={self.window_s}, steady_s="
                              f"{self.steady_s}; use 1 to 50 ms and 0.2 <= window_s <= steady_s <= 600 s")
        if not (2 <= self.block_ms <= 40 and 2 <= self.out_block_ms <= 40):
            raise ConfigError(f"block_ms={self.block_ms}, out_block_ms={self.out_block_ms}; use 2 to 40 ms")
        if not (self.server_latency_ms == 0 or 5 <= self.server_latency_ms <= 500):
            raise ConfigError(f"server_latency_ms={self.server_latency_ms}; use 0 (the server's default) or 5 to 500")
        if not (self.out_latency_ms == 0 or 2 <= self.out_latency_ms <= 500):
            raise ConfigError(f"out_latency_ms={self.out_latency_ms}; use 0 (the server's default) or 2 to 500")
        if not self.jitter_ms < self.overload_ms <= self.max_queue_ms:
            raise ConfigError(f"overload_ms={self.overload_ms}; use more than jitter_ms and at most max_queue_ms")
        if self.resampler_quality not in ("QQ", "LQ", "MQ", "HQ", "VHQ"):
            raise ConfigError(f"resampler_quality={self.resampler_quality!r}; use QQ, LQ, MQ, HQ or VHQ")


class RecentValues:
    """The last ``size`` values a thread records (the worker, a callback), for another thread to summarise
    (the status line); a fixed array, so recording never allocates."""

    def __init__(self, size: int = 512) -> None:
        self._values = np.zeros(size, np.float64)
        self._n = 0

    def add(self, value: float) -> None:
        self._values[self._n % self._values.shape[0]] = value
        self._n += 1

    @property
    def count(self) -> int:
        """How many values were recorded so far (a mark for ``percentile(since=...)``)."""
        return self._n

    def percentile(self, q: float, since: int | None = None) -> float | None:
        """The ``q``-th percentile of what was recorded lately (with ``since``: after ``count`` was that,
        as far as the array reaches back); None when nothing was."""
        size, n = self._values.shape[0], self._n
        k = min(n, size) if since is None else min(n - since, size)
        if k <= 0:
            return None
        idx = np.arange(n - k, n) % size
        return float(np.percentile(self._values[idx], q))


class _OutputPath:
    """One output device: a ring buffer of processed audio at its rate (the adaptive jitter buffer that
    ``LiveConfig`` describes), the resampler from 16 kHz, and comfort noise made up front (no RNG in
    the callback). ``play`` runs in the device callback, ``push`` in the worker."""

    #: an output device that took nothing for this long is stalled: audio queued meanwhile would only play late
    STALL_S = 0.1

    def __init__(self, session: Session, rate_hz: int, config: LiveConfig) -> None:
        self.rate_hz = int(rate_hz)
        self.config = config
        self.ring = RingBuffer(2 * self.rate_hz)
        self.from16 = (soxr.ResampleStream(SAMPLE_RATE_HZ, self.rate_hz, 1, dtype="float32",
                                           quality=config.resampler_quality)
                       if self.rate_hz != SAMPLE_RATE_HZ else None)
        self.noise = np.ascontiguousarray(
            _resample_block(session.comfort_noise(SAMPLE_RATE_HZ), SAMPLE_RATE_HZ, self.rate_hz))
        self.noise_pos = 0
        self.flowing = False  # set once the worker has written processed audio
        self.mean_square = 0.0  # of the last block played (the output meter)
        self.margin = self._samples(config.jitter_ms)  # the jitter margin now (grows on underflow)
        self._low = None  # least audio left after an output callback this window (negative: it ran short)
        self._low_before = None  # the same for the window before
        self._shortfall = 0  # the largest shortfall since the worker last looked (set by the callback)
        self._dropped = 0  # samples the worker dropped at a pause: comfort noise in their place is no miss
        self._window_start = self._last_change = self.last_read_at = time.monotonic()
        self.queue_at_push_ms = RecentValues()  # audio still queued when a chunk's output arrived: its wait

    def _samples(self, ms: float) -> int:
        return int(self.rate_hz * ms / 1000)

    def fill_noise(self, out: np.ndarray) -> None:
        n, pos, noise = out.shape[0], self.noise_pos, self.noise
        idx = (pos + np.arange(n)) % noise.shape[0]
        out[:] = noise[idx]
        self.noise_pos = (pos + n) % noise.shape[0]

    def play(self, out: np.ndarray, muted: bool) -> bool:
        """Fills ``out``; returns False when processed audio ran short (a missed deadline)."""
        self.last_read_at = time.monotonic()
        if muted:  # comfort noise from this very block on; what was queued is dropped
            self.ring.discard(self.ring.readable)
            self.flowing = False  # unmuted, the queue fills up to the margin again
            self.fill_noise(out)
            ok = True
        else:
            got = self.ring.read_into(out)
            if got < out.shape[0] and self._dropped > 0:  # the gap a dropped pause left: on purpose
                covered = min(self._dropped, out.shape[0] - got)
                self._dropped -= covered
                self.fill_noise(out[got : got + covered])
                got += covered
            ok = got == out.shape[0] or not self.flowing
            if got < out.shape[0]:
                self.fill_noise(out[got:])
            if self.flowing:
                left = self.ring.readable - (out.shape[0] - got)
                self._low = left if self._low is None else min(self._low, left)
                if not ok:
                    self._shortfall = max(self._shortfall, out.shape[0] - got)
        self.mean_square = float(np.dot(out, out)) / max(1, out.shape[0])
        return ok

    def dropped(self, n16: int) -> None:
        """The worker dropped ``n16`` samples (16 kHz) of a pause: the gap they leave is not a missed deadline."""
        self._dropped += n16 * self.rate_hz // SAMPLE_RATE_HZ

    def push(self, y16: np.ndarray, speech: bool = True) -> int:
        """Queues 16 kHz output (``speech``: the session's gate was open for it); returns 1 when the queue
        was trimmed: beyond ``max_queue_ms`` (clock drift), or beyond the margin while the device took nothing
        for ``STALL_S``, or, for non-speech output, what the queue held beyond the margin for a whole window
        (a margin grown on an underflow, a burst), which is taken out of that non-speech output."""
        cfg = self.config
        y = self.from16.resample_chunk(y16) if self.from16 is not None else y16
        now = time.monotonic()
        if not self.flowing:
            self.ring.write(self.noise[: self.margin].copy())
            self.flowing = True
            self._window_start = self._last_change = now
        shortfall, self._shortfall = self._shortfall, 0
        base = self._samples(cfg.jitter_ms)
        if shortfall:  # the audio after it is already later by the shortfall; keep that much more
            self.margin = min(self.margin + shortfall, self._samples(cfg.max_jitter_ms))
            self._last_change = now
        elif now - self._last_change >= cfg.steady_s:  # half the way back, at least a step
            self.margin = max(base, self.margin - max(self._samples(cfg.jitter_step_ms), (self.margin - base) // 2))
            self._last_change = now
        if now - self._window_start >= cfg.window_s:
            self._low_before, self._low = self._low, None
            self._window_start = now
        drop = 0
        if not speech and not shortfall and self._low_before is not None:
            low = self._low_before if self._low is None else min(self._low_before, self._low)
            drop = min(max(0, low - self.margin), y.shape[0])  # held beyond the margin for at least a window
            self._low_before -= drop
            if self._low is not None:
                self._low -= drop
        self.queue_at_push_ms.add(1000.0 * self.ring.readable / self.rate_hz)
        self.ring.write(np.ascontiguousarray(y[drop:], np.float32))
        stalled = now - self.last_read_at > self.STALL_S  # the device takes nothing (starting, stuck, gone)
        excess = self.ring.readable - (self.margin if stalled else self._samples(cfg.max_queue_ms))
        if excess > 0:  # what would play late: the newest audio stays
            self.ring.discard(excess)
            return 1
        return int(drop > 0)


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


#: pipewire-pulse's floors under what a client's streams may ask (its defaults: 256/48000, 5.3 ms, which
#: turn a 5 ms output buffer into 16 ms), lowered for rtanon's own streams as the client properties its
#: ``pulse.rules`` set per application; PulseAudio ignores them
PIPEWIRE_PULSE_FLOORS = {"pulse.min.req": "48/48000", "pulse.min.frag": "48/48000", "pulse.min.quantum": "48/48000"}


@contextmanager
def server_latency(ms: int) -> Iterator[None]:
    """While open, the PulseAudio streams this process opens through PortAudio (PipeWire's too, through
    pipewire-pulse, which turns it into the stream's ``node.latency``) ask the server for ``ms`` of
    buffering: libpulse reads ``PULSE_LATENCY_MSEC`` when a stream connects; and every libpulse client
    it opens carries ``PIPEWIRE_PULSE_FLOORS`` (``PULSE_PROP_<key>``). A value the user's environment
    sets is kept; 0 asks for nothing."""
    if not ms:
        yield
        return
    added = {var: value for var, value in [("PULSE_LATENCY_MSEC", str(ms))] +
             [(f"PULSE_PROP_{key}", value) for key, value in PIPEWIRE_PULSE_FLOORS.items()]
             if var not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for var in added:
            os.environ.pop(var, None)


def _resample_block(x: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    return x if from_hz == to_hz else soxr.resample(x, from_hz, to_hz).astype(np.float32)


# -- devices ---------------------------------------------------------------------

PULSE_PREFIX = "pulse:"
WATCH_INTERVAL_S = 0.25  # how often run_live checks its devices


NO_DEVICES_HINT = ("PortAudio sees no audio device: on Linux start PulseAudio or PipeWire (and install "
                   "libasound2-plugins for the ALSA 'pulse' device), or check that ALSA lists your card (aplay -l)")


class DeviceError(ConfigError):
    """An audio device that cannot be used as asked; the message says what to do."""


def resolve_device(spec: str | None, kind: str) -> tuple[int | str | None, dict[str, str]]:
    """Turns a ``--input``/``--output`` value into a PortAudio device and the
    environment it needs; a DeviceError says why it cannot.

    ``None`` is the default device; digits are an index; ``pulse:NAME`` is the
    PulseAudio sink/source NAME reached through the ALSA ``pulse`` device;
    ``rtanon`` (output) is the rtanon virtual microphone's sink when no
    PortAudio device carries that name; anything else is a name substring, as
    python-sounddevice matches it.
    """
    import sounddevice as sd

    from rtanon import pulse

    env_var = "PULSE_SOURCE" if kind == "input" else "PULSE_SINK"
    option = f"--{kind}"
    devices = sd.query_devices()
    if not len(devices):
        raise DeviceError(NO_DEVICES_HINT)
    channels = "max_input_channels" if kind == "input" else "max_output_channels"
    if spec is None:
        try:
            sd.query_devices(None, kind)
        except (sd.PortAudioError, ValueError):
            raise DeviceError(f"no default {kind} device; pick one with {option} (`rtanon devices` lists "
                              "them)") from None
        return None, {}
    if spec.isdigit():
        index = int(spec)
        if index >= len(devices):
            raise DeviceError(f"{option} {spec}: no such device; `rtanon devices` lists {len(devices)} "
                              f"(0 to {len(devices) - 1})")
        if devices[index][channels] < 1:
            raise DeviceError(f"{option} {spec}: {devices[index]['name']!r} has no {kind} channels; "
                              "`rtanon devices` shows which devices do")
        return index, {}
    if spec.startswith(PULSE_PREFIX):
        name = spec[len(PULSE_PREFIX):]
        if not any(d["name"] == "pulse" for d in devices):
            raise DeviceError(f"{option} {spec} needs the ALSA 'pulse' device, which PortAudio does not list: "
                              "start PulseAudio or PipeWire and install libasound2-plugins")
        names = _pulse_names("sources" if kind == "input" else "sinks")
        if not name or (names is not None and name not in names):
            known = ", ".join(sorted(names or [])) or "none"
            raise DeviceError(f"{option} {spec}: no PulseAudio {'source' if kind == 'input' else 'sink'} "
                              f"named {name!r} (there are: {known})")
        return "pulse", {env_var: name}
    try:
        sd.query_devices(spec, kind)
        return spec, {}
    except ValueError as exc:
        if spec == "rtanon":
            ours = pulse.SINK_NAME if kind == "output" else pulse.SOURCE_NAME
            names = _pulse_names("sinks" if kind == "output" else "sources")
            if names is not None and ours not in names:
                raise DeviceError(f"{option} rtanon: the rtanon virtual microphone does not exist yet; run "
                                  "`rtanon virtual-device create` first") from None
            return "pulse", {env_var: ours}
        raise DeviceError(f"{option} {spec}: {exc}; `rtanon devices` lists the devices") from None


def _device_name(device, kind: str) -> str | None:
    """PortAudio's name for a resolved device (None: it has none here)."""
    import sounddevice as sd

    try:
        return sd.query_devices(device, kind)["name"]
    except (sd.PortAudioError, ValueError):
        return None


def _pulse_endpoint(device, env: dict[str, str | None], kind: str) -> str | None:
    """The PulseAudio source (input) or sink (output) a resolved device reaches, or None when it is no
    PulseAudio device or the server does not say: ``PULSE_SOURCE``/``PULSE_SINK`` as the stream will see
    it, else the server's default, for the ALSA ``pulse`` and ``default`` devices."""
    from rtanon import pulse

    var = "PULSE_SOURCE" if kind == "input" else "PULSE_SINK"
    if _device_name(device, kind) not in ("pulse", "default"):
        return None
    chosen = env[var] if var in env else os.environ.get(var)
    if chosen:
        return chosen
    try:
        return pulse.default_device("source" if kind == "input" else "sink")
    except pulse.PulseError:
        return None


def refuse_feedback(in_dev, in_env: dict[str, str | None], out_dev, out_env: dict[str, str | None]) -> None:
    """Raises DeviceError when the input records the output: the output sink's monitor, or the rtanon
    virtual microphone while the output is its sink (a user who picked the virtual microphone as the
    microphone; the pass-through guard would then find the voice played a moment ago in the input and
    play comfort noise)."""
    from rtanon import pulse

    sink = _pulse_endpoint(out_dev, out_env, "output")
    if sink is None:
        return
    source = _pulse_endpoint(in_dev, in_env, "input")
    if source == f"{sink}.monitor" or (sink == pulse.SINK_NAME and source == pulse.SOURCE_NAME):
        raise DeviceError(f"the input is PulseAudio's {source!r}, which records the output {sink!r}: rtanon "
                          "would anonymize its own voice in a loop; pick your microphone with --input "
                          "pulse:NAME (`rtanon devices` lists the sources)")


def pick_rate(device, kind: str, requested: int | None) -> int:
    """``requested`` if given (an error if the device refuses it); else 16 kHz
    when the device takes it (no resampling in rtanon), else its default rate."""
    import sounddevice as sd

    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    rate = requested or SAMPLE_RATE_HZ
    try:
        check(device=device, channels=1, samplerate=rate, dtype="float32")
        return rate
    except Exception as exc:
        if requested:
            raise ConfigError(f"{kind} device {device!r} does not accept {rate} Hz mono float32: {exc}") from None
        return int(sd.query_devices(device, kind)["default_samplerate"])


class FaultInjector:
    """A stage placed last in a session by ``rtanon live --fault-injection``
    (used by ``rtanon soak``): while ``active`` every chunk raises, as a stage
    exception storm would; otherwise it hands the chunk on unchanged (the
    method's stages after it transform it). SIGUSR1 starts a storm, SIGUSR2
    ends it."""

    latency_samples = 0

    def __init__(self, hop: int) -> None:
        self.hop = hop
        self.active = False

    def process(self, chunk: np.ndarray) -> np.ndarray:
        if self.active:
            raise RuntimeError("injected fault (rtanon soak: stage exception storm)")
        return chunk

    def reset(self) -> None:
        pass


def install_fault_injection(session: Session) -> FaultInjector:
    import signal

    injector = FaultInjector(session.chunk_samples)
    session.stages.append(injector)
    signal.signal(signal.SIGUSR1, lambda *_: setattr(injector, "active", True))
    signal.signal(signal.SIGUSR2, lambda *_: setattr(injector, "active", False))
    return injector


def _pulse_names(kind: str) -> set[str] | None:
    """Names of the PulseAudio ``sources``/``sinks`` now, or None when pactl cannot tell."""
    import shutil
    import subprocess

    if shutil.which("pactl") is None:
        return None
    try:
        proc = subprocess.run(["pactl", "list", "short", kind], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {line.split("\t")[1] for line in proc.stdout.splitlines() if "\t" in line}


class DeviceStream:
    """One PortAudio stream that is reopened when it stops (the device went
    away, the sound server killed it) or, for a PulseAudio device, when the
    named source or sink disappears; while it is down the other stream goes
    on (the output plays comfort noise). ``reopens`` counts the reopenings.
    ``env``: the PulseAudio variable (``PULSE_SOURCE``/``PULSE_SINK``) the
    stream sets as it opens, None to unset it; ``out_latency_ms``: the buffer an output on libpulse asks
    the server for (``PulseOutputStream``)."""

    RETRY_S = 0.2
    STUCK_S = 2.5  # PulseAudio can hold a fresh output stream for 1.5 s before it flows
    STALL_S = 0.5  # a stream that flowed and then waits this long for a callback has hung

    def __init__(self, kind: str, device, env: dict[str, str | None], rate: int, blocksize: int, callback,
                 out_latency_ms: int = 0) -> None:
        self.kind, self.device, self.env, self.out_latency_ms = kind, device, env, out_latency_ms
        self.rate, self.blocksize, self.callback = rate, blocksize, callback
        self.pulse_name = next(iter(env.values()), None)  # PULSE_SOURCE / PULSE_SINK
        self.stream = None
        self.reopens = 0
        self.stuck = 0  # reopenings of a stream that stopped calling back
        self.opened_at = 0.0
        self.last_error = ""
        self._next_try = 0.0
        self._watched_at = self._resumed_at = 0.0  # the last watch; when watching resumed after a pause
        self._seen_callback: float | None = None  # the last callback time the watch saw
        self._flowed = False  # callbacks were seen advancing since the stream opened

    @property
    def up(self) -> bool:
        return self.stream is not None and self.stream.active

    @property
    def latency_s(self) -> float:
        return float(self.stream.latency) if self.stream is not None else 0.0

    @property
    def native(self) -> bool:
        """An output to the ALSA ``pulse`` device is opened on PulseAudio itself
        (``rtanon.pulse_stream``), not through the plug-in, which restarts (and can hang) on underruns."""
        from rtanon import pulse_stream

        return self.kind == "output" and _device_name(self.device, self.kind) == "pulse" and pulse_stream.available()

    def open(self) -> None:
        """Opens and starts the stream; raises what PortAudio (or libpulse) raises."""
        import sounddevice as sd

        from rtanon import pulse_stream

        for var, value in self.env.items():  # read by the ALSA pulse plugin when the stream opens
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        if self.native:
            stream = pulse_stream.PulseOutputStream(os.environ.get("PULSE_SINK"), self.rate, self.blocksize,
                                                    self.callback, self.out_latency_ms)
        else:
            cls = sd.InputStream if self.kind == "input" else sd.OutputStream
            stream = cls(device=self.device, channels=1, samplerate=self.rate, dtype="float32",
                         blocksize=self.blocksize, latency="low", callback=self.callback)
        try:
            stream.start()
        except Exception:
            stream.close()
            raise
        self.stream = stream
        self.opened_at = time.monotonic()

    def close(self) -> None:
        if self.stream is not None:
            try:
                self.stream.abort()
                self.stream.close()
            except Exception as exc:  # a dead stream may refuse to close; it is dropped either way
                self.last_error = f"{type(exc).__name__}: {exc}"
            self.stream = None
        self._seen_callback, self._flowed = None, False  # the next stream starts fresh

    def watch(self, present: bool | None, last_callback_at: float | None = None) -> None:
        """Reopens the stream if it died, its PulseAudio device went away (``present`` False), or it is
        stuck: no callback (``last_callback_at``, monotonic; given for outputs, whose device always takes
        audio, not for inputs: a monitor source with nothing playing delivers nothing) for ``STALL_S`` once
        it has flowed (callbacks seen advancing between two watches), ``STUCK_S`` before (PulseAudio may
        hold a fresh stream after its first callback), although PortAudio calls it active: the ALSA pulse
        plug-in can hang so after an underrun (the virtual microphone fell silent for good in a 10-minute
        run; under CPU overload, for 2.5 s at a time until this reopened it). Time this process did not run
        (stopped, starved: the watch came ``STALL_S`` late) does not count. Retries every ``RETRY_S`` while
        it cannot open."""
        now = time.monotonic()
        if now - self._watched_at > self.STALL_S:
            self._resumed_at = now
        self._watched_at = now
        if self.stream is not None and last_callback_at is not None:
            seen = self._seen_callback
            if seen is not None and last_callback_at > seen > self.opened_at:
                self._flowed = True
            self._seen_callback = last_callback_at
            silent = now - max(self.opened_at, last_callback_at, self._resumed_at)
            if silent > (self.STALL_S if self._flowed else self.STUCK_S):
                self.stuck += 1
                self.last_error = f"no callback for {silent:.1f} s: reopened"
                self.close()
        if self.stream is not None and (not self.stream.active or present is False):
            self.close()
        if self.stream is None and present is not False and time.monotonic() >= self._next_try:
            try:
                self.open()
                self.reopens += 1
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._next_try = time.monotonic() + self.RETRY_S


def pulse_presence(streams: list[DeviceStream]) -> dict[str, set[str] | None]:
    """What ``watch_streams`` needs to know of the sound server, asked once per kind (``pactl``: slow, so
    outside any lock): the names of its ``"input"`` sources and ``"output"`` sinks, for the kinds that
    have a stream on a named PulseAudio device."""
    return {kind: _pulse_names("sources" if kind == "input" else "sinks")
            for kind in {st.kind for st in streams if st.pulse_name}}


def watch_streams(streams: list[DeviceStream], present: dict[str, set[str] | None], output: DeviceStream,
                  last_output_at: float) -> None:
    """``DeviceStream.watch`` on each stream: whether its named device is there (``pulse_presence``; None
    when unknown), and for ``output``, the one the core's output callback runs in, its last callback."""
    for stream in streams:
        names = present.get(stream.kind)
        stream.watch(None if names is None or not stream.pulse_name else stream.pulse_name in names,
                     last_output_at if stream is output else None)


class DelayMeter:
    """Device delays as the audio server reports them through PortAudio's
    callback timestamps (capture: now - ADC time; playback: DAC time - now).
    ``device_ms`` is None until both streams reported a delay (a host API
    without timestamps gives zeros; a report beyond 2 s or more than
    ``TOLERANCE_S`` negative is not a delay); then the status line shows it,
    otherwise an estimate from the streams' nominal latencies. A capture
    delay of zero is a report: PulseAudio's ALSA plugin gives it whenever the
    callback has just taken all that was captured."""

    #: a timestamp this far behind ``currentTime`` still reads as a zero delay (the clocks' jitter)
    TOLERANCE_S = 0.002

    def __init__(self) -> None:
        self.in_s: float | None = None
        self.out_s: float | None = None
        self.in_ms, self.out_ms = RecentValues(), RecentValues()  # the reports, for their medians
        self.out_gap_s = 0.0  # the longest wait between two output callbacks since ``take_out_gap``
        self._last_out: float | None = None

    @classmethod
    def _delay_s(cls, now: float, stamp: float, sign: float) -> float | None:
        """The delay ``sign * (stamp - now)`` where both timestamps are given and it is plausible, else None."""
        if now <= 0.0 or stamp <= 0.0:
            return None
        d = sign * (stamp - now)
        return max(0.0, d) if -cls.TOLERANCE_S <= d < 2.0 else None

    def take_out_gap(self) -> float:
        """The longest wait between two output callbacks since the last call, in s (the output stalled)."""
        gap, self.out_gap_s = self.out_gap_s, 0.0
        return gap

    def on_input(self, time_info) -> None:
        self.in_s = self._delay_s(time_info.currentTime, time_info.inputBufferAdcTime, -1.0)
        if self.in_s is not None:
            self.in_ms.add(1000.0 * self.in_s)

    def on_output(self, time_info) -> None:
        now = time.monotonic()
        if self._last_out is not None:
            self.out_gap_s = max(self.out_gap_s, now - self._last_out)
        self._last_out = now
        self.out_s = self._delay_s(time_info.currentTime, time_info.outputBufferDacTime, 1.0)
        if self.out_s is not None:
            self.out_ms.add(1000.0 * self.out_s)

    def device_ms(self) -> float | None:
        return None if self.in_s is None or self.out_s is None else 1000.0 * (self.in_s + self.out_s)


def _since_last_status(marks: dict, fields: dict[str, tuple[RecentValues, float]]) -> dict:
    """Each field's percentile over the values recorded since the last status (``marks``: where each
    series stood then; updated); None where none came."""
    out = {}
    for key, (values, q) in fields.items():
        value = values.percentile(q, since=marks.get(key, 0))
        out[key] = None if value is None else round(value, 2)
    for key, (values, _) in fields.items():
        marks[key] = values.count
    return out


def run_live(session: Session, input_spec: str | None, output_spec: str | None, *,
             config: LiveConfig | None = None, duration_s: float | None = None,
             device_rate_hz: int | None = None, status_interval_s: float = 0.5, stream=sys.stderr,
             json_status=None, name: str = "rtanon live", extra_status=None, stop_when=None) -> LiveCore:
    """Runs the live loop until Ctrl-C or ``duration_s``; returns the core with its counters
    (``core.interrupted``: Ctrl-C ended it). ``json_status``: a text stream that gets one JSON object per
    status interval (for ``rtanon soak``); ``name`` starts the running line; ``extra_status()``: a string
    the status line ends with (``rtanon connect``: the server's state); ``stop_when()``: true ends the loop
    (``rtanon connect``: the session failed)."""
    import json

    import sounddevice as sd

    config = config or LiveConfig()
    in_dev, in_env = resolve_device(input_spec, "input")
    out_dev, out_env = resolve_device(output_spec, "output")
    refuse_feedback(in_dev, in_env, out_dev, out_env)
    os.environ.update(in_env)
    os.environ.update(out_env)  # read by the ALSA pulse plugin when the stream opens
    in_rate = pick_rate(in_dev, "input", device_rate_hz)
    out_rate = pick_rate(out_dev, "output", device_rate_hz)
    core = LiveCore(session, in_rate, out_rate, config)
    counters = session.counters
    delay = DelayMeter()

    def in_cb(indata, frames, time_info, status):
        if status.input_overflow:
            counters.input_overflows += 1
        delay.on_input(time_info)
        core.on_input(indata[:, 0])

    def out_cb(outdata, frames, time_info, status):
        if status.output_underflow:
            counters.output_underflows += 1
        delay.on_output(time_info)
        core.on_output(outdata[:, 0])

    inp = DeviceStream("input", in_dev, in_env, in_rate, in_rate * config.block_ms // 1000, in_cb)
    out = DeviceStream("output", out_dev, out_env, out_rate, out_rate * config.out_block_ms // 1000, out_cb,
                       config.out_latency_ms)
    algo_ms = 1000.0 * session.algorithmic_latency_samples / SAMPLE_RATE_HZ
    core.start()
    asked = ExitStack()
    asked.enter_context(server_latency(config.server_latency_ms))  # for every (re)opening of the streams
    try:
        for device in (out, inp):
            try:
                device.open()
            except (sd.PortAudioError, PulseStreamError) as exc:
                raise DeviceError(f"cannot open the {device.kind} device {device.device!r}: {exc}; "
                                  "`rtanon devices` lists the devices") from None
        t_start = time.monotonic()  # the duration counts from the open streams, not the (slow) opening
        t_end = None if duration_s is None else t_start + duration_s
        print(f"{name}: running, {in_rate} Hz in, {out_rate} Hz out, device latency "
              f"{1000 * inp.latency_s:.0f}+{1000 * out.latency_s:.0f} ms, voice: "
              f"{voice_sentence(session.voice)}; Ctrl-C stops", file=sys.stderr, flush=True)
        next_status, marks = 0.0, {}
        while t_end is None or time.monotonic() < t_end:
            time.sleep(WATCH_INTERVAL_S if t_end is None else min(WATCH_INTERVAL_S,
                                                                  max(0.0, t_end - time.monotonic())))
            if stop_when is not None and stop_when():
                break
            watch_streams([inp, out], pulse_presence([inp, out]), out, core.last_output_at)  # device watchdog
            if time.monotonic() < next_status:
                continue
            next_status = time.monotonic() + status_interval_s
            device_ms = delay.device_ms()
            measured = device_ms is not None
            if not measured:
                device_ms = 1000.0 * (inp.latency_s + out.latency_s)
            latency = algo_ms + core.pipeline_ms() + device_ms
            if stream is not None:
                down = "".join(f" | {s.kind} DOWN" for s in (inp, out) if not s.up)
                overload = core.overload_note()
                down += f" | {overload}" if overload else ""
                stream.write(f"\rin {core.level_dbfs:6.1f} dBFS | delay {'' if measured else '~'}{latency:5.1f} ms "
                             f"({'reported by the audio server' if measured else 'estimated'}; algorithmic "
                             f"{algo_ms:.0f}) | missed {counters.missed_deadlines} | "
                             f"xruns {counters.input_overflows + counters.output_underflows} | "
                             f"errors {counters.stage_errors + core.worker_errors}{down}"
                             f"{extra_status() if extra_status is not None else ''}   ")
                stream.flush()
            if json_status is not None:
                json_status.write(json.dumps({
                    "t": time.monotonic() - t_start, "level_dbfs": round(core.level_dbfs, 1),
                    "out_block_ms": config.out_block_ms,
                    "delay_ms": round(latency, 1), "delay_measured": measured, "algorithmic_ms": algo_ms,
                    **_since_last_status(marks, {"compute_p50_ms": (core.compute_ms, 50),
                                                 "compute_p99_ms": (core.compute_ms, 99),
                                                 "queue_wait_ms": (core.queue_waits, 50),
                                                 "device_in_ms": (delay.in_ms, 50),
                                                 "device_out_ms": (delay.out_ms, 50)}),
                    "device_nominal_ms": [round(1000.0 * inp.latency_s, 1), round(1000.0 * out.latency_s, 1)],
                    "chunks": counters.chunks, "speech_chunks": counters.speech_chunks,
                    "missed_deadlines": counters.missed_deadlines, "input_overflows": counters.input_overflows,
                    "output_underflows": counters.output_underflows, "stage_errors": counters.stage_errors,
                    "worker_errors": core.worker_errors, "input_skips": core.input_skips,
                    "drift_trims": core.drift_trims, "overload_drops": core.overload_drops,
                    "overload": core.overload_note(), "input_up": inp.up, "output_up": out.up,
                    "input_reopens": inp.reopens, "output_reopens": out.reopens,
                    "output_stuck": out.stuck,
                    "output_gap_ms": round(1000.0 * delay.take_out_gap(), 1)}) + "\n")
                json_status.flush()
    except KeyboardInterrupt:
        core.interrupted = True
    finally:
        inp.close()
        out.close()
        core.stop()
        asked.close()
        if stream is not None:
            stream.write("\n")
    return core
