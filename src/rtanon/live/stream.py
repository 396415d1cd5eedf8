"""``DeviceStream``: one PortAudio (or native PulseAudio) stream that reopens itself when its device goes
away, stops or hangs; ``watch_streams`` checks them every ``WATCH_INTERVAL_S``."""

from __future__ import annotations

import os
import time

from rtanon.live.devices import device_name, pulse_names

WATCH_INTERVAL_S = 0.25  # how often run_live checks its devices



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
        (``rtanon.live.pulse_stream``), not through the plug-in, which restarts (and can hang) on underruns."""
        from rtanon.live import pulse_stream

        return self.kind == "output" and device_name(self.device, self.kind) == "pulse" and pulse_stream.available()

    def open(self) -> None:
        """Opens and starts the stream; raises what PortAudio (or libpulse) raises."""
        import sounddevice as sd

        from rtanon.live import pulse_stream

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
    return {kind: pulse_names("sources" if kind == "input" else "sinks")
            for kind in {st.kind for st in streams if st.pulse_name}}


def watch_streams(streams: list[DeviceStream], present: dict[str, set[str] | None], output: DeviceStream,
                  last_output_at: float) -> None:
    """``DeviceStream.watch`` on each stream: whether its named device is there (``pulse_presence``; None
    when unknown), and for ``output``, the one the core's output callback runs in, its last callback."""
    for stream in streams:
        names = present.get(stream.kind)
        stream.watch(None if names is None or not stream.pulse_name else stream.pulse_name in names,
                     last_output_at if stream is output else None)
