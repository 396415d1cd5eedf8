"""PulseAudio / PipeWire-pulse: rtanon's virtual microphone, and a private daemon.

The virtual microphone is two modules on the user's sound server:

- a null sink ``rtanon_sink`` that ``rtanon live --output rtanon`` plays into;
- a remap source ``rtanon_mic`` (description "rtanon") over that sink's
  monitor, which Zoom, Meet or a browser list as a microphone.

``PulseDaemon`` starts a private, loopback-only PulseAudio daemon in a
temporary runtime directory; the tests and ``rtanon bench --e2e`` use it so
they never touch the user's own sound server. ``PipeWireDaemon`` does the same
with PipeWire as most desktops run it: ``pipewire``, ``wireplumber`` (the
session manager, which links streams to devices) and ``pipewire-pulse`` (the
PulseAudio protocol), on a private D-Bus session bus.

PortAudio sees PulseAudio through the ALSA ``pulse`` device; which PulseAudio
sink or source it opens is chosen with the ``PULSE_SINK`` / ``PULSE_SOURCE``
environment variables when the stream opens (see ``rtanon.live.devices``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rtanon.constants import SAMPLE_RATE_HZ

if TYPE_CHECKING:
    import numpy as np

SINK_NAME = "rtanon_sink"
SOURCE_NAME = "rtanon_mic"
SOURCE_DESCRIPTION = "rtanon"


class PulseError(RuntimeError):
    """The sound server is missing or refused a request; the message says what to do."""


def _pactl(args: list[str], env: dict | None = None) -> str:
    if shutil.which("pactl") is None:
        raise PulseError("pactl not found: install it with `sudo apt-get install pulseaudio-utils` "
                         "(works with PulseAudio and PipeWire-pulse)")
    proc = subprocess.run(["pactl", *args], capture_output=True, text=True, env=env, timeout=20)
    if proc.returncode != 0:
        msg = "; ".join(line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip())
        raise PulseError(f"pactl {' '.join(args)} failed: {msg or 'no sound server?'} "
                         "(is PulseAudio or PipeWire-pulse running for this user?)")
    return proc.stdout


def _modules(env: dict | None) -> list[tuple[str, str, str]]:
    """(index, name, arguments) of every loaded module."""
    rows = []
    for line in _pactl(["list", "short", "modules"], env).splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            rows.append((parts[0], parts[1], parts[2] if len(parts) > 2 else ""))
    return rows


def _names(kind: str, env: dict | None) -> list[str]:
    return [line.split("\t")[1] for line in _pactl(["list", "short", kind], env).splitlines() if "\t" in line]


def list_devices(kind: str, env: dict | None = None) -> list[tuple[str, str]]:
    """(name, description) of every ``"sources"`` or ``"sinks"`` entry of the sound server."""
    rows, name = [], None
    c_locale = {**(os.environ if env is None else env), "LC_ALL": "C"}  # untranslated field names
    for line in _pactl(["list", kind], c_locale).splitlines():
        line = line.strip()
        if line.startswith("Name: "):
            name = line[len("Name: "):]
        elif line.startswith("Description: ") and name is not None:
            rows.append((name, line[len("Description: "):]))
            name = None
    return rows


def default_device(kind: str, env: dict | None = None) -> str | None:
    """The name of the sound server's default ``"source"`` or ``"sink"`` (what the ALSA ``pulse`` device
    reaches when ``PULSE_SOURCE``/``PULSE_SINK`` is unset), or None when the server does not say."""
    field = f"Default {kind.capitalize()}: "
    c_locale = {**(os.environ if env is None else env), "LC_ALL": "C"}
    for line in _pactl(["info"], c_locale).splitlines():
        if line.startswith(field):
            return line[len(field):].strip() or None
    return None


@dataclass(frozen=True)
class VirtualDeviceStatus:
    sink: bool
    source: bool

    @property
    def ready(self) -> bool:
        return self.sink and self.source


def status(env: dict | None = None) -> VirtualDeviceStatus:
    return VirtualDeviceStatus(SINK_NAME in _names("sinks", env), SOURCE_NAME in _names("sources", env))


def create(env: dict | None = None) -> VirtualDeviceStatus:
    """Creates the null sink and the "rtanon" microphone; idempotent."""
    st = status(env)
    if not st.sink:
        _pactl(["load-module", "module-null-sink", f"sink_name={SINK_NAME}",
                "sink_properties=device.description=rtanon-output", "rate=48000", "channels=1"], env)
    if not st.source:
        _pactl(["load-module", "module-remap-source", f"master={SINK_NAME}.monitor",
                f"source_name={SOURCE_NAME}", f"source_properties=device.description={SOURCE_DESCRIPTION}"],
               env)
    return status(env)


def remove(env: dict | None = None) -> int:
    """Unloads rtanon's modules (source first); returns how many were unloaded."""
    ours = [m for m in _modules(env) if f"source_name={SOURCE_NAME}" in m[2]]
    ours += [m for m in _modules(env) if f"sink_name={SINK_NAME}" in m[2]]
    for index, _, _ in ours:
        _pactl(["unload-module", index], env)
    return len(ours)


class PulseDaemon:
    """A private PulseAudio daemon (loopback only: a unix socket in a temporary
    runtime dir). ``env`` holds the variables a client needs to reach it.

    Usage::

        with PulseDaemon() as pd:
            subprocess.run(["pactl", "info"], env=pd.env)
    """

    def __init__(self, startup_timeout_s: float = 15.0) -> None:
        if shutil.which("pulseaudio") is None:
            raise PulseError("pulseaudio not found: `sudo apt-get install pulseaudio pulseaudio-utils "
                             "libasound2-plugins` (needed only for tests and `rtanon bench --e2e`)")
        self._timeout = startup_timeout_s
        self._dir: tempfile.TemporaryDirectory | None = None
        self._proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}

    def __enter__(self) -> "PulseDaemon":
        self._dir = tempfile.TemporaryDirectory(prefix="rtanon-pulse-")
        root = Path(self._dir.name)
        (root / "runtime").mkdir(mode=0o700)
        (root / "home").mkdir()
        config = root / "daemon.pa"
        config.write_text("load-module module-native-protocol-unix auth-anonymous=1\n"
                          "load-module module-null-sink sink_name=rtanon_test_default\n"
                          "set-default-sink rtanon_test_default\n")
        self.env = {**os.environ, "XDG_RUNTIME_DIR": str(root / "runtime"), "HOME": str(root / "home"),
                    "PULSE_RUNTIME_PATH": str(root / "runtime" / "pulse"), "PULSE_STATE_PATH": str(root / "state")}
        for var in ("PULSE_SERVER", "PULSE_SINK", "PULSE_SOURCE", "DBUS_SESSION_BUS_ADDRESS"):
            self.env.pop(var, None)
        self.log_path = root / "pulseaudio.log"
        self._proc = subprocess.Popen(
            ["pulseaudio", "-n", "-F", str(config), "--daemonize=no", "--exit-idle-time=-1",
             "--disallow-exit", "--use-pid-file=no", "--log-target=stderr", "--log-level=error"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "w"))
        deadline = time.monotonic() + self._timeout
        while True:
            if self._proc.poll() is not None:
                log = self.log_path.read_text()[-2000:]
                self.__exit__(None, None, None)
                raise PulseError(f"pulseaudio exited at start-up: {log}")
            if subprocess.run(["pactl", "info"], env=self.env, capture_output=True).returncode == 0:
                return self
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise PulseError("pulseaudio did not answer within "
                                 f"{self._timeout:.0f} s; log: {self.log_path}")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def pactl(self, *args: str) -> str:
        return _pactl(list(args), self.env)

    def load_null_sink(self, name: str, rate_hz: int = 48000) -> None:
        """A null sink ``name``; its monitor ``name.monitor`` works as a microphone fed by what plays into it."""
        self.pactl("load-module", "module-null-sink", f"sink_name={name}", f"rate={rate_hz}", "channels=1")


class PipeWireDaemon(PulseDaemon):
    """A private PipeWire (``pipewire``, ``wireplumber``, ``pipewire-pulse``, and the D-Bus session bus
    WirePlumber needs) in a temporary runtime directory, reached like ``PulseDaemon`` through ``env``
    (its PulseAudio socket); PulseError, saying why, where a part is missing or does not start."""

    TOOLS = {"pipewire": "pipewire", "wireplumber": "wireplumber", "pipewire-pulse": "pipewire-pulse",
             "dbus-daemon": "dbus", "pactl": "pulseaudio-utils"}

    def __init__(self, startup_timeout_s: float = 15.0) -> None:
        missing = [tool for tool in self.TOOLS if shutil.which(tool) is None]
        if missing:
            packages = " ".join(dict.fromkeys(self.TOOLS[t] for t in missing))
            raise PulseError(f"{', '.join(missing)} not found: `sudo apt-get install {packages}` (needed only "
                             "for the PipeWire tests)")
        self._timeout = startup_timeout_s
        self._dir: tempfile.TemporaryDirectory | None = None
        self._procs: list[subprocess.Popen] = []
        self._dbus_pid: int | None = None
        self.env: dict[str, str] = {}

    def __enter__(self) -> "PipeWireDaemon":
        self._dir = tempfile.TemporaryDirectory(prefix="rtanon-pipewire-")
        root = Path(self._dir.name)
        runtime = root / "runtime"
        runtime.mkdir(mode=0o700)
        for sub in ("home", "config", "state"):
            (root / sub).mkdir()
        self.env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "HOME": str(root / "home"),
                    "XDG_CONFIG_HOME": str(root / "config"), "XDG_STATE_HOME": str(root / "state"),
                    "PIPEWIRE_RUNTIME_DIR": str(runtime), "PULSE_RUNTIME_PATH": str(runtime / "pulse")}
        for var in ("PULSE_SERVER", "PULSE_SINK", "PULSE_SOURCE", "DBUS_SESSION_BUS_ADDRESS", "PIPEWIRE_REMOTE",
                    "DISPLAY", "WAYLAND_DISPLAY"):
            self.env.pop(var, None)
        self.log_path = root / "pipewire.log"
        log = open(self.log_path, "w")
        try:
            bus = subprocess.run(["dbus-daemon", "--session", "--fork", "--nopidfile", "--print-address=1",
                                  "--print-pid=1", f"--address=unix:path={runtime / 'bus'}"], env=self.env,
                                 capture_output=True, text=True, timeout=self._timeout)
            if bus.returncode != 0:
                raise PulseError(f"dbus-daemon did not start: {bus.stderr.strip()[-300:]}")
            address, pid = bus.stdout.split()[:2]
            self._dbus_pid = int(pid)
            self.env["DBUS_SESSION_BUS_ADDRESS"] = address
            for tool in ("pipewire", "wireplumber", "pipewire-pulse"):
                self._procs.append(subprocess.Popen([tool], env=self.env, stdout=subprocess.DEVNULL, stderr=log))
                if tool == "pipewire":
                    self._wait(lambda: (runtime / "pipewire-0").exists(), "pipewire")
            self._wait(lambda: subprocess.run(["pactl", "info"], env=self.env,
                                              capture_output=True).returncode == 0, "pipewire-pulse")
            # WirePlumber's null output is the default sink once it runs: then streams get linked
            self._wait(lambda: bool(_names("sinks", self.env)), "wireplumber")
        except BaseException:
            log.close()
            self.__exit__(None, None, None)
            raise
        log.close()
        return self

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self._timeout
        while not ready():
            dead = [p for p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = self.log_path.read_text()[-1500:] if self.log_path.exists() else ""
                why = f"{dead[0].args[0]} exited" if dead else f"{what} did not answer within {self._timeout:.0f} s"
                raise PulseError(f"PipeWire did not start ({why}); log: {' | '.join(tail.splitlines()[-5:])}")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs = []
        if self._dbus_pid is not None:
            try:
                os.kill(self._dbus_pid, 15)
            except ProcessLookupError:
                pass
            self._dbus_pid = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


#: The private sound servers, by the name ``rtanon bench --e2e --server`` takes.
DAEMONS = {"pulseaudio": PulseDaemon, "pipewire": PipeWireDaemon}


class LoopPlayer:
    """Plays ``signal`` (16 kHz mono float32) in a loop into the sink ``sink`` of the sound server that
    ``env`` reaches, through ``pacat`` (which paces the writes), from ``start()`` until ``stop()``: a fake
    microphone's voice for ``rtanon bench --e2e`` and ``rtanon soak``."""

    def __init__(self, sink: str, signal: np.ndarray, env: dict[str, str], latency_ms: int = 100) -> None:
        import numpy as np

        self._signal = np.ascontiguousarray(signal, "<f4")
        self._stop = threading.Event()
        self._proc = subprocess.Popen(["pacat", "--playback", f"--device={sink}", "--format=float32le",
                                       f"--rate={SAMPLE_RATE_HZ}", "--channels=1", f"--latency-msec={latency_ms}"],
                                      env=env, stdin=subprocess.PIPE)

    def start(self) -> None:
        threading.Thread(target=self._feed, name="rtanon-loop-player", daemon=True).start()

    def _feed(self) -> None:
        import numpy as np

        block, i = SAMPLE_RATE_HZ // 10, 0
        try:
            while not self._stop.is_set():
                self._proc.stdin.write(np.take(self._signal, np.arange(i, i + block), mode="wrap").tobytes())
                i = (i + block) % self._signal.shape[0]
        except (BrokenPipeError, ValueError, OSError):
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


class SourceRecorder:
    """Records one PulseAudio source through PortAudio (16-bit, 10 ms blocks); each block is stamped
    with the monotonic time it was captured (PortAudio's input latency subtracted), so two recorders'
    timelines line up. Use ``with rec.stream:``; then ``timeline(t0)``. ``overflows`` counts the blocks
    PortAudio flagged as following lost input (a busy machine): their recording has a gap."""

    #: how far a block's stamp may stray from its run's sample clock before a new run starts
    RUN_TOLERANCE_S = 0.06
    #: a run at least this long is placed on a fitted clock slope (``_clock``), a shorter one at its median offset
    MIN_FIT_S = 10.0

    def __init__(self, source: str) -> None:
        import sounddevice as sd

        os.environ["PULSE_SOURCE"] = source  # read when the stream opens
        self.blocks: list[tuple[float, np.ndarray]] = []
        self.lost_before: list[bool] = []  # per block: PortAudio flagged lost input before it
        self.overflows = 0
        self.stream = sd.InputStream(device="pulse", channels=1, samplerate=SAMPLE_RATE_HZ, dtype="float32",
                                     blocksize=SAMPLE_RATE_HZ // 100, latency="low", callback=self._cb)

    def _cb(self, indata, frames, time_info, status) -> None:
        import numpy as np

        self.overflows += bool(status.input_overflow)
        self.lost_before.append(bool(status.input_overflow))
        lag = time_info.currentTime - time_info.inputBufferAdcTime
        lag = lag if 0.0 <= lag < 2.0 else 0.0
        self.blocks.append((time.monotonic() - lag, (indata[:, 0] * 32767).astype(np.int16)))

    def _runs(self) -> list[list[tuple[float, float, np.ndarray]]]:
        """The blocks split into runs: (stamp, seconds into the run, block) each (see ``placed``)."""
        runs: list[list[tuple[float, float, np.ndarray]]] = []
        for (t, b), lost in zip(self.blocks, self.lost_before):
            if runs and not lost:
                t_run, k_run, b_last = runs[-1][-1]
                k = k_run + b_last.shape[0] / SAMPLE_RATE_HZ
                if abs((t - runs[-1][0][0]) - k) <= self.RUN_TOLERANCE_S:
                    runs[-1].append((t, k, b))
                    continue
            runs.append([(t, 0.0, b)])
        return runs

    @staticmethod
    def _clock(run) -> tuple[float, float]:
        """(offset, slope) of a run's stamps against its sample position: stamp = offset + (1 + slope) k.
        The slope is the median stamp offset of the run's last third against its first third (robust to
        bursty stamps); runs under ``MIN_FIT_S`` keep slope 0."""
        import numpy as np

        k = np.array([k for _, k, _ in run])
        d = np.array([t for t, _, _ in run]) - k
        slope = 0.0
        if k[-1] >= SourceRecorder.MIN_FIT_S:
            a, b = k < k[-1] / 3, k > 2 * k[-1] / 3
            slope = float((np.median(d[b]) - np.median(d[a])) / (np.median(k[b]) - np.median(k[a])))
        return float(np.median(d - slope * k)), slope

    def placed(self) -> list[tuple[float, np.ndarray]]:
        """(capture time, block) of every block. A server that delivers in bursts (PipeWire, its 21 ms
        quantum against 10 ms blocks) jitters each stamp by a third of a block or more, which would tear the
        waveform apart; so blocks sit at their sample position, contiguous, on the line that fits the stamps
        of their run (``_clock``): a sound server's sample clock may run tens of ppm off the monotonic one
        (31 ppm measured on a soak's output sink), which a constant offset would turn into a delay that
        drifts over the run. A run ends at a block PortAudio flags as following lost input, or whose stamp
        is RUN_TOLERANCE_S off the run's sample clock (samples lost unflagged, or clocks drifting apart)."""
        out = []
        for run in self._runs():
            offset, slope = self._clock(run)
            out += [(offset + (1.0 + slope) * k, b) for _, k, b in run]
        return out

    def run_summary(self, t0: float) -> list[dict]:
        """How ``placed`` put each run: its start (s after ``t0``), length, the slope of its stamps against
        its sample position (ppm; ``placed`` follows it) and the stamps' spread around that line (p99 of
        the absolute residual, ms)."""
        import numpy as np

        out = []
        for run in self._runs():
            offset, slope = self._clock(run)
            resid = np.array([t - offset - (1.0 + slope) * k for t, k, _ in run])
            out.append({"start_s": round(offset - t0, 3), "seconds": round(run[-1][1], 2), "blocks": len(run),
                        "slope_ppm": round(1e6 * slope, 2),
                        "spread_ms": round(1e3 * float(np.percentile(np.abs(resid), 99)), 2)})
        return out

    def timeline(self, t0: float, n: int | None = None) -> np.ndarray:
        """The recording as float32 on a timeline from monotonic time ``t0``, ``n`` samples long
        (by default up to the end of the last block); gaps are zeros. Blocks as ``placed()`` puts them."""
        import numpy as np

        blocks = self.placed()
        if n is None:
            n = max((int(round((t - t0) * SAMPLE_RATE_HZ)) + b.shape[0] for t, b in blocks), default=0)
        out = np.zeros(max(n, 0), np.float32)
        for t, b in blocks:
            i = int(round((t - t0) * SAMPLE_RATE_HZ))
            if 0 <= i < n:
                out[i : i + b.shape[0]] = b[: n - i] / 32767.0
        return out
