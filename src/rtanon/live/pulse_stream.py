"""Playback on a PulseAudio sink through libpulse-simple, for the live output.

PortAudio reaches PulseAudio (and pipewire-pulse) through the ALSA ``pulse``
plug-in, which restarts its stream after every underrun. Measured on a private
server (10 ms blocks, 15 ms asked of the server, four busy processes on two
cores): the PortAudio output stopped calling back for good within 2 s of the
load, while a libpulse stream written by a thread kept playing through the
same load and through callbacks delayed 80 ms (its server waits for
``prebuf`` and goes on; nothing reconnects). ``PulseOutputStream`` is that
stream with the part of ``sounddevice.OutputStream`` that ``DeviceStream``
uses: ``start``, ``abort``, ``close``, ``active``, ``latency``, and the
callback ``callback(outdata, frames, time_info, status)``, called from its
writer thread before each block is written (``pa_simple_write`` blocks until
the server wants more, so the server paces it as it paces a callback).

libpulse-simple reports no underflows; ``status.output_underflow`` is set when
the writer came back later than the audio the server held when it last
looked (then that audio had run out).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import threading
import time
from types import SimpleNamespace

import numpy as np

_PA_SAMPLE_FLOAT32LE = 5
_PA_STREAM_PLAYBACK = 1
_DEFAULT = 0xFFFFFFFF  # (uint32_t) -1: the server's choice
_OPEN_TIMEOUT_S = 10.0
_LATENCY_EVERY = 10  # blocks between two latency queries


class PulseStreamError(OSError):
    """libpulse-simple is missing, or the server refused the stream; the message says which."""


class _SampleSpec(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("rate", ctypes.c_uint32), ("channels", ctypes.c_uint8)]


class _BufferAttr(ctypes.Structure):
    _fields_ = [("maxlength", ctypes.c_uint32), ("tlength", ctypes.c_uint32), ("prebuf", ctypes.c_uint32),
                ("minreq", ctypes.c_uint32), ("fragsize", ctypes.c_uint32)]


_LIB: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    """libpulse-simple with the four functions used, typed (PulseStreamError when it is not installed)."""
    global _LIB
    if _LIB is None:
        name = ctypes.util.find_library("pulse-simple") or "libpulse-simple.so.0"
        try:
            lib = ctypes.CDLL(name)
            lib.pa_strerror  # in libpulse, which libpulse-simple links
        except (OSError, AttributeError) as exc:
            raise PulseStreamError(f"libpulse-simple not found ({exc}): install libpulse0") from None
        lib.pa_simple_new.restype = ctypes.c_void_p
        lib.pa_simple_new.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.POINTER(_SampleSpec), ctypes.c_void_p,
                                      ctypes.POINTER(_BufferAttr), ctypes.POINTER(ctypes.c_int)]
        lib.pa_simple_write.restype = ctypes.c_int
        lib.pa_simple_write.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.POINTER(ctypes.c_int)]
        lib.pa_simple_get_latency.restype = ctypes.c_uint64
        lib.pa_simple_get_latency.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.pa_simple_free.restype = None
        lib.pa_simple_free.argtypes = [ctypes.c_void_p]
        lib.pa_strerror.restype = ctypes.c_char_p
        lib.pa_strerror.argtypes = [ctypes.c_int]
        _LIB = lib
    return _LIB


def available() -> bool:
    """Whether libpulse-simple can be loaded here."""
    try:
        _lib()
    except PulseStreamError:
        return False
    return True


class PulseOutputStream:
    """A mono float32 playback stream on ``sink`` (None: the server's default) at ``samplerate``, written
    ``blocksize`` frames at a time by a thread that calls ``callback`` for each block; ``latency_ms``: the
    server's target buffer (``tlength``, 0: the server's default; the request size and the start threshold
    are the server's choice, a quarter of it and what it allows). ``PULSE_LATENCY_MSEC`` would replace
    it: the stream opens without it."""

    def __init__(self, sink: str | None, samplerate: int, blocksize: int, callback, latency_ms: float) -> None:
        self.sink, self.samplerate, self.blocksize = sink, int(samplerate), int(blocksize)
        self.callback = callback
        frame = 4  # float32 mono
        tlength = int(self.samplerate * latency_ms / 1000) * frame
        self._attr = _BufferAttr(_DEFAULT, tlength or _DEFAULT, _DEFAULT, _DEFAULT, _DEFAULT)
        self._latency_s = (tlength or 2 * self.blocksize * frame) / frame / self.samplerate
        self._stop = threading.Event()
        self._opened = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: int | None = None
        self.error = ""

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set() and not self.error

    @property
    def latency(self) -> float:
        """The playback delay the server last reported, in s (its target before it reported)."""
        return self._latency_s

    def start(self) -> None:
        """Connects to the server and starts the writer; raises PulseStreamError when it cannot."""
        lib = _lib()
        self._thread = threading.Thread(target=self._run, args=(lib,), name="rtanon-pulse-out", daemon=True)
        asked = os.environ.pop("PULSE_LATENCY_MSEC", None)  # libpulse would put it in place of the attributes
        try:
            self._thread.start()
            opened = self._opened.wait(_OPEN_TIMEOUT_S)
        finally:
            if asked is not None:
                os.environ["PULSE_LATENCY_MSEC"] = asked
        if not opened:
            self._stop.set()
            raise PulseStreamError(f"the PulseAudio server did not open a stream in {_OPEN_TIMEOUT_S:.0f} s")
        if self._handle is None:
            raise PulseStreamError(self.error)

    def _run(self, lib: ctypes.CDLL) -> None:
        err = ctypes.c_int(0)
        spec = _SampleSpec(_PA_SAMPLE_FLOAT32LE, self.samplerate, 1)
        handle = lib.pa_simple_new(None, b"rtanon", _PA_STREAM_PLAYBACK,
                                   None if self.sink is None else self.sink.encode(), b"anonymized voice",
                                   ctypes.byref(spec), None, ctypes.byref(self._attr), ctypes.byref(err))
        if not handle:
            self.error = f"PulseAudio refused the stream to {self.sink or 'the default sink'}: " \
                         f"{lib.pa_strerror(err.value).decode()}"
            self._opened.set()
            return
        self._handle = handle
        self._opened.set()
        out = np.zeros((self.blocksize, 1), np.float32)
        status = SimpleNamespace(output_underflow=False)
        held_until = None  # when the audio the server held at the last write runs out
        try:
            for n in itertools.count():
                if self._stop.is_set():
                    break
                now = time.monotonic()
                info = SimpleNamespace(currentTime=now, outputBufferDacTime=now + self._latency_s,
                                       inputBufferAdcTime=0.0)
                self.callback(out, self.blocksize, info, status)
                # as PortAudio does, the next callback hears of an underflow that happened before this write
                status.output_underflow = held_until is not None and time.monotonic() > held_until
                if lib.pa_simple_write(handle, out.ctypes.data, out.nbytes, ctypes.byref(err)) < 0:
                    self.error = f"PulseAudio stream ended: {lib.pa_strerror(err.value).decode()}"
                    break
                if n % _LATENCY_EVERY == 0:
                    usec = lib.pa_simple_get_latency(handle, ctypes.byref(err))
                    if usec != 0xFFFFFFFFFFFFFFFF:
                        self._latency_s = usec / 1e6
                held_until = time.monotonic() + self._latency_s
        except Exception as exc:  # the callback failed: the stream ends, as PortAudio's does
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            lib.pa_simple_free(handle)
            self._handle = None

    def abort(self) -> None:
        """Stops writing: no callback starts after it returns (one running now is given 0.2 s to end).
        The writer may still be blocked in a write (a server that holds a fresh stream, or hangs): it
        frees the stream when that returns."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=0.2)

    def close(self) -> None:
        """Stops the stream; the writer frees it as it ends (it may be blocked in a hung server)."""
        self.abort()
