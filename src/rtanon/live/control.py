"""What a live UI controls, in one class that the web page and the tests drive.

``LiveControl`` owns the audio streams, the ``LiveCore`` between them and
the session, and offers the page's actions as methods (``start``, ``stop``,
``set_mute``, ``new_voice``, ``set_method``, ``set_privacy``,
``set_chunk_ms``, ``set_devices``, ``create_virtual_mic``) plus ``act(dict)``, the same actions
as JSON messages, and ``status()``, the figures the page shows.

Fail closed through every switch: a new voice is a new ``Session`` swapped
in by the worker at the next pause (its gate starts closed, so it plays
comfort noise until it hears speech); a method, privacy point or chunk
change swaps a session of another ``Anonymizer`` at once; a device change closes the
streams (nothing plays) and opens new ones around the same session. No path
copies input to output.

``LiveSettings`` (devices, monitor, method, privacy point, chunk) are saved, through
``rtanon.atomic``, to ``$XDG_CONFIG_HOME/rtanon/live-ui.json`` so that
``rtanon ui`` starts where the last session left off. The pseudo-voice (seed,
identity) is not saved, and the user's own voice never is.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from rtanon.config import (ALLOWED_CHUNK_MS, METHOD_NAMES, PRIVACY_POINTS, SAMPLE_RATE_HZ, AnonymizerConfig,
                           ConfigError, NeuralConfig, StreamConfig)
from rtanon.engine import Anonymizer, Session
from rtanon.errors import UserError
from rtanon.live.config import LiveConfig
from rtanon.live.core import LiveCore
from rtanon.live.devices import pick_rate, resolve_device
from rtanon.live.feedback import refuse_feedback
from rtanon.live.server import server_latency
from rtanon.live.stream import WATCH_INTERVAL_S, DeviceStream, pulse_presence, watch_streams
from rtanon.methods import voice_sentence as describe_voice
from rtanon.paths import printable, read_capped

SETTINGS_NAME = "live-ui.json"
#: A settings file is about 100 bytes; a larger one is not ours.
MAX_SETTINGS_BYTES = 1 << 16
#: The longest device name a setting may hold (PortAudio and PulseAudio names are far shorter).
DEVICE_CHARS = 256


@dataclass
class LiveSettings:
    """Devices as ``rtanon live`` takes them (None: the system default;
    ``monitor`` None: no monitor), method, the neural method's privacy point (``--privacy``) and chunk
    size."""

    input: str | None = None
    output: str | None = None
    monitor: str | None = None
    method: str = AnonymizerConfig().method
    privacy: str = NeuralConfig().privacy
    chunk_ms: int = StreamConfig().chunk_ms

    def validate(self) -> None:
        """Every field by type and range (the settings file and the page's messages are untrusted)."""
        for name in ("input", "output", "monitor"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and len(value) <= DEVICE_CHARS
                                          and value.isprintable()):
                raise ConfigError(f"device {name} must be a device name or index as text (at most "
                                  f"{DEVICE_CHARS} printable characters) or null, not {printable(value, 40)}")
        if not isinstance(self.method, str) or self.method not in METHOD_NAMES:
            raise ConfigError(f"unknown method {printable(self.method, 40)}; choose one of {', '.join(METHOD_NAMES)}")
        if not isinstance(self.privacy, str) or self.privacy not in PRIVACY_POINTS:
            raise ConfigError(f"unknown privacy point {printable(self.privacy, 40)}; choose one of "
                              f"{', '.join(PRIVACY_POINTS)}")
        if type(self.chunk_ms) is not int or self.chunk_ms not in ALLOWED_CHUNK_MS:
            raise ConfigError(f"chunk_ms={printable(self.chunk_ms, 40)}; use one of {ALLOWED_CHUNK_MS}")


def settings_path() -> Path:
    """Where the last-used settings live: the user's config dir (XDG)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rtanon" / SETTINGS_NAME


def load_settings(path: Path | None = None) -> LiveSettings:
    """The saved settings, or the defaults when there are none (or they are unreadable)."""
    path = path or settings_path()
    try:
        raw = json.loads(read_capped(path, MAX_SETTINGS_BYTES, "settings file"))
        known = {f.name for f in fields(LiveSettings)}
        settings = LiveSettings(**{k: v for k, v in raw.items() if k in known})
        settings.validate()
        return settings
    except (OSError, ValueError, TypeError, AttributeError, RecursionError, UserError):
        return LiveSettings()


def save_settings(settings: LiveSettings, path: Path | None = None) -> None:
    """Writes ``settings`` once they validate (ConfigError otherwise: nothing unchecked is kept)."""
    from rtanon.atomic import write_text

    settings.validate()
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(asdict(settings), indent=1) + "\n")


class LiveControl:
    """The live anonymizer behind a control surface. Thread-safe: actions take a lock."""

    def __init__(self, settings: LiveSettings, base_config: AnonymizerConfig | None = None, *,
                 seed: int | None = None, identity=None, device_rate_hz: int | None = None,
                 live_config: LiveConfig | None = None, settings_file: Path | None = None) -> None:
        settings.validate()
        self.settings = replace(settings)
        self._base = base_config or AnonymizerConfig()
        self._seed, self._identity = seed, identity  # the first session's voice, when pinned
        self._device_rate = device_rate_hz
        self._live_config = live_config or LiveConfig()
        self._settings_file = settings_file
        self._anonymizers: dict[tuple[str, str, int], Anonymizer] = {}
        self._lock = threading.RLock()
        self._env0 = {v: os.environ.get(v) for v in ("PULSE_SOURCE", "PULSE_SINK")}
        self.session: Session | None = None
        self.core: LiveCore | None = None
        self._streams: list[DeviceStream] = []
        self._watching: threading.Event | None = None  # set: the device watcher of the last start stops
        self._device_latency_s = 0.0
        self.muted = False
        self.last_error = ""

    # -- engine ------------------------------------------------------------------
    def anonymizer(self, method: str, chunk_ms: int, privacy: str | None = None) -> Anonymizer:
        """One Anonymizer per (method, privacy point, chunk): models load once per process. ``privacy`` None:
        the base configuration's (McAdams has none: every point shares one)."""
        privacy = privacy or self._base.neural.privacy
        key = (method, privacy if method == "neural" else "", chunk_ms)
        if key not in self._anonymizers:
            cfg = replace(self._base, method=method, stream=StreamConfig(chunk_ms=chunk_ms),
                          neural=replace(self._base.neural, privacy=privacy))
            self._anonymizers[key] = Anonymizer(cfg)
            self._anonymizers[key].warm_up()  # here, not as a backlog in the worker after a method change
        return self._anonymizers[key]

    def _new_session(self, fresh: bool = False) -> Session:
        """``fresh``: a new voice, clearly unlike the one playing (or about to)."""
        s = self.settings
        seed, identity = (None, None) if fresh else (self._seed, self._identity)
        unlike = None
        if fresh:
            unlike = self.session if self.core is None else (self.core.next_session or self.core.session)
        anonymizer = self.anonymizer(s.method, s.chunk_ms, s.privacy)
        session = anonymizer.open_session(seed=seed, identity=identity, unlike=unlike)
        self._seed = None  # a seed pins the first voice only; an identity file pins every one
        return session

    def _save(self) -> None:
        try:
            save_settings(self.settings, self._settings_file)
        except (OSError, UserError) as exc:  # the audio matters more than the memory of settings (a FIFO or
            self.last_error = f"could not save settings: {exc}"  # a folder at the path is refused, not fatal

    # -- audio streams -------------------------------------------------------------
    def _open(self, kind: str, spec: str | None, callback, counters) -> DeviceStream:
        """The (not yet opened) stream for a device setting; the PulseAudio variable it sets when it opens
        falls back to this process's own (a stream of the other device must not leave its name there)."""
        dev, env = resolve_device(spec, kind)
        var = "PULSE_SOURCE" if kind == "input" else "PULSE_SINK"
        rate = pick_rate(dev, kind, self._device_rate)
        cfg = self._live_config
        block = rate * (cfg.block_ms if kind == "input" else cfg.out_block_ms) // 1000
        if kind == "input":
            def cb(indata, frames, time_info, status):
                if status.input_overflow:
                    counters.input_overflows += 1
                callback(indata[:, 0])
        else:
            def cb(outdata, frames, time_info, status):
                if status.output_underflow:
                    counters.output_underflows += 1
                callback(outdata[:, 0])
        return DeviceStream(kind, dev, {var: env.get(var, self._env0[var])}, rate, block, cb, cfg.out_latency_ms)

    @property
    def running(self) -> bool:
        return bool(self._streams)

    def start(self) -> None:
        """Opens the devices and starts anonymizing (a no-op when running); a thread then reopens a stream
        that dies, loses its device or hangs, as ``rtanon live`` does."""
        with self._lock:
            if self.running:
                return
            if self.session is None:
                self.session = self._new_session()
            s, session = self.settings, self.session
            counters = session.counters
            holder: dict = {}
            inp = self._open("input", s.input, lambda x: holder["core"].on_input(x), counters)
            out = self._open("output", s.output, lambda y: holder["core"].on_output(y), counters)
            refuse_feedback(inp.device, inp.env, out.device, out.env)
            core = LiveCore(session, inp.rate, out.rate, self._live_config)
            holder["core"] = core
            streams = [inp, out]
            if s.monitor is not None:
                mon = self._open("output", s.monitor, core.on_monitor, counters)
                streams.append(mon)
                core.set_monitor(mon.rate)
            core.muted = self.muted
            core.start()
            with server_latency(self._live_config.server_latency_ms):  # libpulse reads it as streams connect
                try:
                    for stream in reversed(streams):  # outputs first: they play comfort noise until audio flows
                        stream.open()
                except BaseException:
                    for stream in streams:
                        stream.close()
                    core.stop()
                    raise
            self.core, self._streams = core, streams
            self._device_latency_s = inp.latency_s + out.latency_s
            self._watching = threading.Event()
            threading.Thread(target=self._watch_devices, args=(self._watching, core, streams), daemon=True,
                             name="rtanon-devices").start()
            self._save()

    def _watch_devices(self, stop: threading.Event, core: LiveCore, streams: list[DeviceStream]) -> None:
        """Every ``WATCH_INTERVAL_S`` until ``stop``: ``DeviceStream.watch`` on each stream (the main output
        with the time of its last callback), under the lock, so that an action never meets a half-open
        stream."""
        while not stop.wait(WATCH_INTERVAL_S):
            present = pulse_presence(streams)
            if not self._lock.acquire(timeout=WATCH_INTERVAL_S):
                continue
            try:
                if stop.is_set():
                    return
                with server_latency(self._live_config.server_latency_ms):
                    watch_streams(streams, present, streams[1], core.last_output_at)
            finally:
                self._lock.release()

    def stop(self) -> None:
        """Closes the devices (nothing plays); the session (voice) is kept for the next start."""
        with self._lock:
            if self._watching is not None:
                self._watching.set()
                self._watching = None
            for stream in self._streams:
                stream.close()
            self._streams = []
            if self.core is not None:
                self.core.stop()
                # the worker may have swapped in a new voice, or not yet taken the one asked for
                nxt = self.core.next_session
                if nxt is not None:
                    nxt.counters = self.core.session.counters
                self.session = nxt or self.core.session
                self.core = None
                self.session.reset()

    close = stop

    # -- actions ---------------------------------------------------------------------
    def set_mute(self, muted: bool) -> None:
        """Comfort noise on every output from the next device block on (or back to the voice)."""
        self.muted = bool(muted)
        core = self.core
        if core is not None:
            core.muted = self.muted

    def new_voice(self) -> None:
        """A fresh pseudo-speaker, swapped in at the next pause (never mid-word)."""
        with self._lock:
            fresh = self._new_session(fresh=True)
            self._identity = None  # asked for a new voice: the pinned one is left behind
            if self.core is not None:
                self.core.replace_session(fresh, at_pause=True)
            else:
                self.session = fresh

    def _switch_engine(self, **changes) -> None:
        with self._lock:
            old = replace(self.settings)
            self.settings = replace(self.settings, **changes)
            try:
                self.settings.validate()
                session = self._new_session()  # loads the method's models first: audio goes on meanwhile
            except BaseException:
                self.settings = old
                raise
            if self.core is not None:
                self.core.replace_session(session, at_pause=False)
            else:
                self.session = session
            self._save()

    def set_method(self, method: str) -> None:
        if method != self.settings.method:
            self._switch_engine(method=method)

    def set_privacy(self, privacy: str) -> None:
        """The neural method's privacy point (its packaged vocoder). Under McAdams it is kept for the next
        switch to the neural method; the voice playing stays."""
        if privacy == self.settings.privacy:
            return
        if self.settings.method == "neural":
            self._switch_engine(privacy=privacy)
            return
        with self._lock:
            new = replace(self.settings, privacy=privacy)
            new.validate()
            self.settings = new
            self._save()

    def set_chunk_ms(self, chunk_ms: int) -> None:
        if chunk_ms != self.settings.chunk_ms:
            self._switch_engine(chunk_ms=chunk_ms)

    def set_devices(self, **devices: str | None) -> None:
        """``input``, ``output``, ``monitor`` (None or "" for default / no monitor); reopens the
        streams when running. On a failure the previous devices are restored."""
        unknown = set(devices) - {"input", "output", "monitor"}
        if unknown:
            raise ConfigError(f"unknown device setting(s): {', '.join(sorted(unknown))}")
        with self._lock:
            old = replace(self.settings)
            new = replace(self.settings, **{k: (v or None) for k, v in devices.items()})
            new.validate()
            self.settings = new
            was_running = self.running
            self.stop()
            if not was_running:
                self._save()
                return
            try:
                self.start()
            except Exception:
                self.settings = old
                self.start()
                raise

    def create_virtual_mic(self) -> None:
        """Creates the rtanon virtual microphone on the user's sound server."""
        from rtanon.live import pulse

        pulse.create()

    def act(self, message: dict) -> None:
        """One action as the page sends it: ``{"action": NAME, FIELD: VALUE...}`` (see ``ACTIONS``). Each
        field is checked by name and type before anything happens; ranges are the setters'."""
        name = message.get("action") if isinstance(message, dict) else None
        if not isinstance(name, str) or name not in ACTIONS:
            raise ConfigError(f"unknown action {printable(name, 40)}; use one of {', '.join(ACTIONS)}")
        types, handler = ACTIONS[name]
        values = {k: v for k, v in message.items() if k != "action"}
        for key, value in values.items():
            if key not in types:
                raise ConfigError(f"action {name} takes {', '.join(types) or 'no fields'}, not "
                                  f"{printable(key, 40)}")
            kinds = types[key] if isinstance(types[key], tuple) else (types[key],)
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise ConfigError(f"action {name}: {key} must be "
                                  f"{' or '.join(_JSON_TYPE[k] for k in kinds)}, not {printable(value, 40)}")
        handler(self, **values)

    # -- what the page shows ----------------------------------------------------------
    def status(self) -> dict:
        core, session = self.core, (self.core.session if self.core is not None else self.session)
        s = self.settings
        out = {"t": time.time(), "running": core is not None, "muted": self.muted,
               "voice_pending": bool(core is not None and core.session_pending),
               "settings": asdict(s), "error": self.last_error,
               "in_dbfs": -120.0, "out_dbfs": -120.0, "gate": False, "queue_ms": 0.0}
        if session is not None:
            c = session.counters
            algo = 1000.0 * session.algorithmic_latency_samples / SAMPLE_RATE_HZ
            cfg = session.anonymizer.config
            if cfg.method == "neural":
                out["privacy"] = cfg.neural.privacy
            out.update(method=cfg.method, chunk_ms=cfg.stream.chunk_ms,
                       voice=describe_voice(session.voice), algorithmic_ms=algo, missed=c.missed_deadlines,
                       xruns=c.input_overflows + c.output_underflows, errors=c.stage_errors,
                       last_error=c.last_error or self.last_error)
        if core is not None:
            out["down"] = [stream.kind for stream in self._streams if not stream.up]  # being reopened
            out.update(in_dbfs=core.level_dbfs, out_dbfs=core.out_level_dbfs, gate=session.last_speech,
                       queue_ms=core.queued_ms, errors=out["errors"] + core.worker_errors,
                       overload=core.overload_note(), overload_drops=core.overload_drops,
                       e2e_ms=out["algorithmic_ms"] + core.pipeline_ms() + 1000.0 * self._device_latency_s)
        return out

    def devices(self) -> dict:
        """Input and output choices by name: PortAudio devices, PulseAudio sources and sinks,
        and the rtanon virtual microphone (``virtual_mic``: whether it exists)."""
        import sounddevice as sd

        from rtanon.live import pulse

        inputs = [{"id": "", "label": "system default"}]
        outputs = [{"id": "", "label": "system default"}]
        for d in sd.query_devices():
            if d["max_input_channels"] > 0:
                inputs.append({"id": d["name"], "label": d["name"]})
            if d["max_output_channels"] > 0:
                outputs.append({"id": d["name"], "label": d["name"]})
        virtual = False
        try:
            for kind, choices, ours in (("sources", inputs, pulse.SOURCE_NAME), ("sinks", outputs, pulse.SINK_NAME)):
                rows = [(n, d) for n, d in pulse.list_devices(kind) if n != ours]  # not our own output
                descs = [d for _, d in rows]
                for name, desc in rows:  # the description, and the name where descriptions repeat
                    label = desc if descs.count(desc) == 1 else f"{desc} [{name}]"
                    choices.append({"id": f"pulse:{name}", "label": f"{label} (PulseAudio)"})
            virtual = pulse.status().ready
        except pulse.PulseError:
            pass
        outputs.insert(1, {"id": "rtanon", "label": "rtanon virtual microphone"
                           + ("" if virtual else " (not created yet)")})
        return {"inputs": inputs, "outputs": outputs, "virtual_mic": virtual}


_JSON_TYPE = {bool: "true or false", int: "an integer", str: "a string", type(None): "null"}
_DEVICE = (str, type(None))

#: The page's actions: name -> (the fields it takes, with their types; handler(control, **fields)).
ACTIONS = {
    "start": ({}, lambda c: c.start()),
    "stop": ({}, lambda c: c.stop()),
    "mute": ({"value": bool}, lambda c, value=True: c.set_mute(value)),
    "new_voice": ({}, lambda c: c.new_voice()),
    "method": ({"value": str}, lambda c, value=None: c.set_method(value)),
    "privacy": ({"value": str}, lambda c, value=None: c.set_privacy(value)),
    "chunk_ms": ({"value": int}, lambda c, value=None: c.set_chunk_ms(value)),
    "devices": ({"input": _DEVICE, "output": _DEVICE, "monitor": _DEVICE}, lambda c, **d: c.set_devices(**d)),
    "create_virtual_mic": ({}, lambda c: c.create_virtual_mic()),
}
