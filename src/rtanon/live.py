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
from dataclasses import dataclass

import numpy as np
import soxr

from rtanon._core import RingBuffer
from rtanon.config import SAMPLE_RATE_HZ, ConfigError
from rtanon.engine import Session


@dataclass(frozen=True)
class LiveConfig:
    """``jitter_ms``: processed audio queued ahead of the output callback once
    audio flows (absorbs worker and device block jitter); ``max_queue_ms``:
    beyond this the queue is trimmed (clock drift between devices);
    ``block_ms``: device callback size; ``resampler_quality``: soxr quality
    for device rates other than 16 kHz (``"LQ"`` keeps its delay low)."""

    jitter_ms: int = 20
    max_queue_ms: int = 200
    block_ms: int = 10
    resampler_quality: str = "LQ"

    def validate(self) -> None:
        if not 0 <= self.jitter_ms <= 500:
            raise ConfigError(f"jitter_ms={self.jitter_ms}; use 0 to 500 ms")
        if not self.jitter_ms < self.max_queue_ms <= 2000:
            raise ConfigError(f"max_queue_ms={self.max_queue_ms}; use more than jitter_ms and at most 2000")
        if not 2 <= self.block_ms <= 40:
            raise ConfigError(f"block_ms={self.block_ms}; use 2 to 40 ms")
        if self.resampler_quality not in ("QQ", "LQ", "MQ", "HQ", "VHQ"):
            raise ConfigError(f"resampler_quality={self.resampler_quality!r}; use QQ, LQ, MQ, HQ or VHQ")


class _OutputPath:
    """One output device: a ring buffer of processed audio at its rate, the
    resampler from 16 kHz, and comfort noise made up front (no RNG in the callback)."""

    def __init__(self, session: Session, rate_hz: int, quality: str) -> None:
        self.rate_hz = int(rate_hz)
        self.ring = RingBuffer(2 * self.rate_hz)
        self.from16 = (soxr.ResampleStream(SAMPLE_RATE_HZ, self.rate_hz, 1, dtype="float32", quality=quality)
                       if self.rate_hz != SAMPLE_RATE_HZ else None)
        self.noise = np.ascontiguousarray(
            _resample_block(session.comfort_noise(SAMPLE_RATE_HZ), SAMPLE_RATE_HZ, self.rate_hz))
        self.noise_pos = 0
        self.flowing = False  # set once the worker has written processed audio
        self.mean_square = 0.0  # of the last block played (the output meter)
        self._low_water = None  # least audio left in the queue when new audio came, this window
        self._window_start = time.monotonic()

    def fill_noise(self, out: np.ndarray) -> None:
        n, pos, noise = out.shape[0], self.noise_pos, self.noise
        idx = (pos + np.arange(n)) % noise.shape[0]
        out[:] = noise[idx]
        self.noise_pos = (pos + n) % noise.shape[0]

    def play(self, out: np.ndarray, muted: bool) -> bool:
        """Fills ``out``; returns False when processed audio ran short (a missed deadline)."""
        if muted:  # comfort noise from this very block on; what was queued is dropped
            self.ring.discard(self.ring.readable)
            self.fill_noise(out)
            ok = True
        else:
            got = self.ring.read_into(out)
            ok = got == out.shape[0] or not self.flowing
            if got < out.shape[0]:
                self.fill_noise(out[got:])
        self.mean_square = float(np.dot(out, out)) / max(1, out.shape[0])
        return ok

    def push(self, y16: np.ndarray, jitter_ms: int, max_queue_ms: int, window_s: float = 2.0) -> int:
        """Queues 16 kHz output; returns 1 when the queue had to be trimmed: beyond ``max_queue_ms``
        (clock drift), or when for ``window_s`` it never ran below ``jitter_ms`` plus one block's worth
        (a burst at stream start-up that would otherwise stay as extra delay)."""
        y = self.from16.resample_chunk(y16) if self.from16 is not None else y16
        jitter = self.rate_hz * jitter_ms // 1000
        if not self.flowing:
            self.ring.write(self.noise[:jitter].copy())
            self.flowing = True
            self._window_start = time.monotonic()
        left = self.ring.readable
        self._low_water = left if self._low_water is None else min(self._low_water, left)
        self.ring.write(np.ascontiguousarray(y, np.float32))
        excess = self.ring.readable - self.rate_hz * max_queue_ms // 1000
        if excess > 0:
            self.ring.discard(excess)
            return 1
        if time.monotonic() - self._window_start >= window_s:
            surplus, self._low_water = self._low_water - jitter - y.shape[0], None
            self._window_start = time.monotonic()
            if surplus > 0:
                self.ring.discard(surplus)
                return 1
        return 0


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
        self.session = session
        self.in_rate_hz, self.out_rate_hz = int(in_rate_hz), int(out_rate_hz)
        self._in_ring = RingBuffer(2 * self.in_rate_hz)
        q = self.config.resampler_quality
        self._to16 = (soxr.ResampleStream(self.in_rate_hz, SAMPLE_RATE_HZ, 1, dtype="float32", quality=q)
                      if self.in_rate_hz != SAMPLE_RATE_HZ else None)
        self._out = _OutputPath(session, self.out_rate_hz, q)
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
        self._monitor = None if rate_hz is None else _OutputPath(self.session, rate_hz,
                                                                 self.config.resampler_quality)

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
    def queued_ms(self) -> float:
        return 1000.0 * self._out.ring.readable / self.out_rate_hz

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
        y = np.concatenate([self.session.process(c) for c in pending[:usable].reshape(-1, chunk)])
        cfg = self.config
        self.drift_trims += self._out.push(y, cfg.jitter_ms, cfg.max_queue_ms)
        monitor = self._monitor
        if monitor is not None:
            monitor.push(y, cfg.jitter_ms, cfg.max_queue_ms)


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
        if spec == "rtanon" and kind == "output":
            return "pulse", {env_var: pulse.SINK_NAME}
        if spec == "rtanon" and kind == "input":
            return "pulse", {env_var: pulse.SOURCE_NAME}
        raise DeviceError(f"{option} {spec}: {exc}; `rtanon devices` lists the devices") from None


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
    on (the output plays comfort noise). ``reopens`` counts the reopenings."""

    RETRY_S = 0.2

    def __init__(self, kind: str, device, env: dict[str, str], rate: int, blocksize: int, callback) -> None:
        self.kind, self.device, self.env = kind, device, env
        self.rate, self.blocksize, self.callback = rate, blocksize, callback
        self.pulse_name = next(iter(env.values()), None)  # PULSE_SOURCE / PULSE_SINK
        self.stream = None
        self.reopens = 0
        self.last_error = ""
        self._next_try = 0.0

    @property
    def up(self) -> bool:
        return self.stream is not None and self.stream.active

    @property
    def latency_s(self) -> float:
        return float(self.stream.latency) if self.stream is not None else 0.0

    def open(self) -> None:
        """Opens and starts the stream; raises what PortAudio raises."""
        import sounddevice as sd

        os.environ.update(self.env)  # read by the ALSA pulse plugin when the stream opens
        cls = sd.InputStream if self.kind == "input" else sd.OutputStream
        stream = cls(device=self.device, channels=1, samplerate=self.rate, dtype="float32",
                     blocksize=self.blocksize, latency="low", callback=self.callback)
        try:
            stream.start()
        except Exception:
            stream.close()
            raise
        self.stream = stream

    def close(self) -> None:
        if self.stream is not None:
            try:
                self.stream.abort()
                self.stream.close()
            except Exception as exc:  # a dead stream may refuse to close; it is dropped either way
                self.last_error = f"{type(exc).__name__}: {exc}"
            self.stream = None

    def watch(self, present: bool | None) -> None:
        """Reopens the stream if it died or its PulseAudio device went away
        (``present`` False); retries every ``RETRY_S`` while it cannot."""
        if self.stream is not None and (not self.stream.active or present is False):
            self.close()
        if self.stream is None and present is not False and time.monotonic() >= self._next_try:
            try:
                self.open()
                self.reopens += 1
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._next_try = time.monotonic() + self.RETRY_S


class DelayMeter:
    """Device delays as the audio server reports them through PortAudio's
    callback timestamps (capture: now - ADC time; playback: DAC time - now).
    ``measured_ms`` is None until both streams reported a plausible delay
    (some host APIs give zero timestamps); then the status line shows it,
    otherwise an estimate from the streams' nominal latencies."""

    def __init__(self) -> None:
        self.in_s = 0.0
        self.out_s = 0.0

    def on_input(self, time_info) -> None:
        d = time_info.currentTime - time_info.inputBufferAdcTime
        self.in_s = d if 0.0 < d < 2.0 else 0.0

    def on_output(self, time_info) -> None:
        d = time_info.outputBufferDacTime - time_info.currentTime
        self.out_s = d if 0.0 < d < 2.0 else 0.0

    def device_ms(self) -> float | None:
        return 1000.0 * (self.in_s + self.out_s) if self.in_s > 0.0 and self.out_s > 0.0 else None


def run_live(session: Session, input_spec: str | None, output_spec: str | None, *,
             config: LiveConfig | None = None, duration_s: float | None = None,
             device_rate_hz: int | None = None, status_interval_s: float = 0.5, stream=sys.stderr,
             json_status=None, name: str = "rtanon live", extra_status=None) -> LiveCore:
    """Runs the live loop until Ctrl-C or ``duration_s``; returns the core with its counters
    (``core.interrupted``: Ctrl-C ended it). ``json_status``: a text stream that gets one JSON object per
    status interval (for ``rtanon soak``); ``name`` starts the running line; ``extra_status()``: a string
    the status line ends with (``rtanon connect``: the server's state)."""
    import json

    import sounddevice as sd

    config = config or LiveConfig()
    in_dev, in_env = resolve_device(input_spec, "input")
    out_dev, out_env = resolve_device(output_spec, "output")
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
    out = DeviceStream("output", out_dev, out_env, out_rate, out_rate * config.block_ms // 1000, out_cb)
    algo_ms = 1000.0 * session.algorithmic_latency_samples / SAMPLE_RATE_HZ
    core.start()
    try:
        for device in (out, inp):
            try:
                device.open()
            except sd.PortAudioError as exc:
                raise DeviceError(f"cannot open the {device.kind} device {device.device!r}: {exc}; "
                                  "`rtanon devices` lists the devices") from None
        t_start = time.monotonic()  # the duration counts from the open streams, not the (slow) opening
        t_end = None if duration_s is None else t_start + duration_s
        print(f"{name}: running, {in_rate} Hz in, {out_rate} Hz out, device latency "
              f"{1000 * inp.latency_s:.0f}+{1000 * out.latency_s:.0f} ms, voice {session.voice}; "
              "Ctrl-C stops", file=sys.stderr, flush=True)
        next_status = 0.0
        while t_end is None or time.monotonic() < t_end:
            time.sleep(WATCH_INTERVAL_S if t_end is None else min(WATCH_INTERVAL_S,
                                                                  max(0.0, t_end - time.monotonic())))
            sources = _pulse_names("sources") if inp.pulse_name else None  # device watchdog
            sinks = _pulse_names("sinks") if out.pulse_name else None
            inp.watch(None if sources is None else inp.pulse_name in sources)
            out.watch(None if sinks is None else out.pulse_name in sinks)
            if time.monotonic() < next_status:
                continue
            next_status = time.monotonic() + status_interval_s
            device_ms = delay.device_ms()
            measured = device_ms is not None
            if not measured:
                device_ms = 1000.0 * (inp.latency_s + out.latency_s)
            latency = algo_ms + core.queued_ms + device_ms
            if stream is not None:
                down = "".join(f" | {s.kind} DOWN" for s in (inp, out) if not s.up)
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
                    "delay_ms": round(latency, 1), "delay_measured": measured, "algorithmic_ms": algo_ms,
                    "chunks": counters.chunks, "speech_chunks": counters.speech_chunks,
                    "missed_deadlines": counters.missed_deadlines, "input_overflows": counters.input_overflows,
                    "output_underflows": counters.output_underflows, "stage_errors": counters.stage_errors,
                    "worker_errors": core.worker_errors, "input_skips": core.input_skips,
                    "drift_trims": core.drift_trims, "input_up": inp.up, "output_up": out.up,
                    "input_reopens": inp.reopens, "output_reopens": out.reopens}) + "\n")
                json_status.flush()
    except KeyboardInterrupt:
        core.interrupted = True
    finally:
        inp.close()
        out.close()
        core.stop()
        if stream is not None:
            stream.write("\n")
    return core
