"""``rtanon connect``'s session: the live loop's engine :class:`rtanon.engine.Session`, computed by an
``rtanon serve`` server instead of local models.

:class:`RemoteSession` has what :class:`rtanon.live.LiveCore` and :func:`rtanon.live.run_live` use of a
``Session`` (``process``, ``chunk_samples``, ``counters``, ``comfort_noise``, ``algorithmic_latency_samples``,
``stage_latency_samples``, ``voice``, ``last_speech``, ``reset``), so the live loop (devices, ring
buffers, worker, status line) runs unchanged with the compute on the server. It imports neither ONNX
Runtime nor any model: a laptop without the models can run it.

The pipeline: ``process(frame n)`` sends frame ``n`` and returns the server's answer to frame
``n - P`` (``P = pipeline_ms / 20``), waiting for it at most until ``pipeline_ms`` after that frame was
sent. An answer that is not back by then, and every frame while the server is away, is comfort noise,
never the input, counted as a missed deadline (``late`` and ``unsent`` say which). The pipeline is part
of ``algorithmic_latency_samples``. A background thread holds the WebSocket in its own asyncio loop
(:class:`rtanon.serve.client.ServeClient`); when the connection breaks or the server stops answering it
reconnects with a growing pause, and the new session draws a fresh voice unless an identity pins it.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass

import numpy as np

from rtanon.config import ConfigError, VadConfig
from rtanon.constants import FRAME_SAMPLES, SAMPLE_RATE_HZ
from rtanon.engine import Counters
from rtanon.errors import UserError
from rtanon.paths import printable
from rtanon.stages.base import check_chunk

SEQ_MASK = 0xFFFFFFFF  # sequence numbers are uint32 on the wire
#: an answer louder than this (RMS) is speech: the server's comfort noise sits at -66 dBFS
SPEECH_RMS = 10.0 ** (-50.0 / 20.0)


class ConnectError(UserError):
    """The server cannot be reached or refused the session; the message says what to do."""


@dataclass(frozen=True)
class RemoteConfig:
    """``pipeline_ms``: how long after a frame is sent its answer may come back (a multiple of 20 ms; the
    answer is played this much later, so it adds to the delay); ``connect_timeout_s``: the longest wait
    for the server's ready message (it may load models first); ``retry_max_s``: the longest pause
    between two reconnection attempts; ``stall_s``: no answer for this long while frames go out counts
    as a lost connection; ``heartbeat_s``: WebSocket ping interval (a dead peer is noticed after it)."""

    pipeline_ms: int = 80
    connect_timeout_s: float = 30.0
    retry_max_s: float = 5.0
    stall_s: float = 3.0
    heartbeat_s: float = 5.0

    def validate(self) -> None:
        frame_ms = FRAME_SAMPLES * 1000 // SAMPLE_RATE_HZ
        if self.pipeline_ms % frame_ms or not frame_ms <= self.pipeline_ms <= 1000:
            raise ConfigError(f"pipeline_ms={self.pipeline_ms}: use a multiple of {frame_ms} from {frame_ms} "
                              "to 1000 ms (80 covers the server's 60 ms deadline plus a loopback or LAN round trip)")
        if not 0.1 <= self.retry_max_s <= 60.0:
            raise ConfigError(f"retry_max_s={self.retry_max_s}: use 0.1 to 60 s")

    @property
    def pipeline_frames(self) -> int:
        return self.pipeline_ms * SAMPLE_RATE_HZ // 1000 // FRAME_SAMPLES


def _describe(exc: BaseException, url: str) -> str:
    """A one-line reason a connection attempt failed, saying what to do."""
    import aiohttp

    text = printable(str(exc) or type(exc).__name__, 160)
    if isinstance(exc, asyncio.TimeoutError):
        return f"{url} did not answer in time (is `rtanon serve` running there?)"
    if isinstance(exc, aiohttp.WSServerHandshakeError) or "refused: HTTP" in text:
        status = getattr(exc, "status", None) or text.rsplit(" ", 1)[-1]
        return {"401": "the server refused the token: --token-file must hold the token of the server's "
                       "own --token-file",
                "503": "the server is full (its --max-sessions); try again later",
                "404": f"{url} is not an rtanon serve WebSocket (the path is /ws)"}.get(
            str(status), f"the server refused the connection (HTTP {status})")
    if isinstance(exc, (aiohttp.ClientConnectorError, OSError)):
        return f"cannot reach {url}: {text} (is `rtanon serve` running there?)"
    return f"the server closed the session: {text}"


class RemoteSession:
    """A session computed by ``rtanon serve`` (see the module docstring). ``open()`` connects (raises
    :class:`ConnectError` with the reason when the first connection fails); ``close()`` says bye.
    ``process`` is called from one thread (the live worker); the network runs in another."""

    def __init__(self, url: str, token: str, start: dict | None = None, config: RemoteConfig | None = None) -> None:
        self.config = config or RemoteConfig()
        self.config.validate()
        self.url, self._token, self.start = url, token, dict(start or {})
        self.chunk_samples = FRAME_SAMPLES
        self.pipeline_frames = self.config.pipeline_frames
        self.counters = Counters()
        self.last_speech = False
        self.ready: dict = {}  # the server's ready message of the current (or last) connection
        self.connected = False
        self.reconnects = 0
        self.late = 0  # frames sent whose answer was not back within pipeline_ms
        self.unsent = 0  # frames not sent (the server was away) or lost with a broken connection
        self.last_error = ""
        self.round_trip_s: collections.deque = collections.deque(maxlen=3000)
        level = VadConfig().comfort_noise_dbfs
        self._noise_rms = 0.0 if level is None else 10.0 ** (level / 20.0)
        self._noise_rng = np.random.default_rng()
        self._seq = 0
        self._cond = threading.Condition()
        self._sent: dict[int, float] = {}  # wire seq -> when it was sent, until its answer is due
        self._answers: dict[int, np.ndarray] = {}
        self._last_sent_t = self._last_answer_t = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None  # the network thread's, from open()
        self._outbox: asyncio.Queue | None = None
        self._thread: threading.Thread | None = None
        self._first = threading.Event()
        self._first_error = ""
        self._closing: asyncio.Event | None = None
        self._client = None

    # -- the Session interface the live loop uses ------------------------------------------------------
    @property
    def algorithmic_latency_samples(self) -> int:
        """The server's algorithmic latency (its chunk and stages) plus this client's pipeline."""
        server = int(round(float(self.ready.get("latency_ms", 0.0)) * SAMPLE_RATE_HZ / 1000))
        return server + self.pipeline_frames * FRAME_SAMPLES

    @property
    def stage_latency_samples(self) -> int:
        return self.algorithmic_latency_samples - self.chunk_samples

    @property
    def voice(self) -> dict:
        return {**self.ready.get("voice", {}), "server": self.url}

    def comfort_noise(self, n: int) -> np.ndarray:
        """``n`` samples of comfort noise (float32, 16 kHz), at the engine's level."""
        if self._noise_rms == 0.0:
            return np.zeros(n, np.float32)
        return (self._noise_rng.standard_normal(n) * self._noise_rms).astype(np.float32)

    def reset(self) -> None:
        """Nothing to forget here: the server's session keeps its own state."""

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Sends one frame (320 float32 samples at 16 kHz, mono) and returns the server's answer to the
        frame ``pipeline_frames`` before it (same shape, float32 in [-1, 1]), or comfort noise."""
        check_chunk(chunk, self.chunk_samples, "RemoteSession.process")
        if not np.isfinite(chunk).all():
            self.counters.nonfinite_inputs += 1
            chunk = np.nan_to_num(chunk, nan=0.0, posinf=1.0, neginf=-1.0)
        x = np.clip(chunk, -1.0, 1.0).astype(np.float32)
        seq, self._seq = self._seq, self._seq + 1
        due = seq - self.pipeline_frames
        y = None
        with self._cond:
            outbox = self._outbox
            if self.connected and outbox is not None:
                now = time.monotonic()
                self._sent[seq & SEQ_MASK] = now
                self._last_sent_t = now
                self._loop.call_soon_threadsafe(outbox.put_nowait, (seq & SEQ_MASK, x))
            if due >= 0:
                sent_t = self._sent.get(due & SEQ_MASK)
                if sent_t is None:
                    self.unsent += 1
                else:
                    key = due & SEQ_MASK  # wait for its answer, or for the connection to end
                    self._cond.wait_for(lambda: key in self._answers or key not in self._sent,
                                        timeout=max(0.0, sent_t + self.config.pipeline_ms / 1000 - time.monotonic()))
                    self._sent.pop(key, None)
                    y = self._answers.pop(key, None)
                    self.late += y is None
        self.counters.chunks += 1
        if y is None:
            self.counters.missed_deadlines += due >= 0  # the first frames fill the pipeline: nothing is due
            self.last_speech = False
            return self.comfort_noise(self.chunk_samples)
        self.last_speech = bool(np.sqrt(np.mean(np.square(y))) > SPEECH_RMS)
        self.counters.speech_chunks += self.last_speech
        self.counters.rendered_chunks += self.last_speech
        return y

    # -- connection ---------------------------------------------------------------------------------
    def open(self) -> "RemoteSession":
        """Connects and waits for the server's ready message; raises ConnectError if that fails."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),),
                                        name="rtanon-connect", daemon=True)
        self._thread.start()
        if not self._first.wait(self.config.connect_timeout_s + 5.0):
            self.close()
            raise ConnectError(f"{self.url} did not answer in {self.config.connect_timeout_s:.0f} s")
        if self._first_error:
            self.close()
            raise ConnectError(self._first_error)
        return self

    def close(self) -> None:
        """Says bye to the server and stops the network thread."""
        if self._thread is None:
            return
        if self._closing is not None:
            self._loop.call_soon_threadsafe(self._closing.set)
        self._thread.join(10.0)
        self._thread = None
        if not self._loop.is_running():
            self._loop.close()

    def stats(self) -> dict:
        """The client's counters and round-trip percentiles (ms) of the last answers."""
        rtt = np.asarray(self.round_trip_s) * 1e3
        return {"frames": self.counters.chunks, "missed_deadlines": self.counters.missed_deadlines,
                "late": self.late, "unsent": self.unsent, "reconnects": self.reconnects,
                "round_trip_ms_p50": round(float(np.percentile(rtt, 50)), 1) if rtt.size else None,
                "round_trip_ms_p99": round(float(np.percentile(rtt, 99)), 1) if rtt.size else None}

    def status(self) -> str:
        """A few words for the live status line: the server's state and the median round trip."""
        if not self.connected:
            return " | server DOWN, reconnecting"
        rtt = self.stats()["round_trip_ms_p50"]
        return f" | server rtt {rtt:.0f} ms" if rtt is not None else " | server up"

    async def _run(self) -> None:
        """The network thread: connect, pump frames until the connection ends, reconnect."""
        from rtanon.serve.client import ServeClient

        self._closing = asyncio.Event()
        pause = 0.2
        first = True
        while not self._closing.is_set():
            try:
                client = await asyncio.wait_for(
                    ServeClient.open(self.url, self._token, self.start, heartbeat=self.config.heartbeat_s),
                    self.config.connect_timeout_s)
            except Exception as exc:
                self.last_error = _describe(exc, self.url)
                if first:
                    self._first_error = self.last_error
                    self._first.set()
                    return
                try:
                    await asyncio.wait_for(self._closing.wait(), pause)
                except asyncio.TimeoutError:
                    pass
                pause = min(2 * pause, self.config.retry_max_s)
                continue
            pause = 0.2
            self.reconnects += not first
            first = False
            self.last_error = await self._pump(client)
            try:
                await asyncio.wait_for(client.close(), 2.0)
            except Exception:  # a dead connection may refuse a polite close
                pass
        self._first.set()

    async def _pump(self, client) -> str:
        """Sends the outbox and reads answers until the connection ends or stalls; returns why it ended."""
        outbox: asyncio.Queue = asyncio.Queue()
        with self._cond:
            self.ready = client.ready
            self._outbox = outbox
            self._last_answer_t = self._last_sent_t = time.monotonic()
            self.connected = True
        self._first.set()

        async def send():
            while True:
                seq, x = await outbox.get()
                await client.send(seq, x)

        async def receive():
            while True:
                seq, y = await client.receive(timeout=None)
                with self._cond:
                    now = time.monotonic()
                    self._last_answer_t = now
                    sent_t = self._sent.get(seq)
                    if sent_t is not None:  # still awaited (a late answer is dropped)
                        self._answers[seq] = y
                        self.round_trip_s.append(now - sent_t)
                        self._cond.notify_all()

        async def watch():
            while True:
                await asyncio.sleep(0.25)
                if self._last_sent_t - self._last_answer_t > self.config.stall_s:
                    raise ConnectionError(f"no answer for {self.config.stall_s:.0f} s")

        tasks = [asyncio.create_task(t()) for t in (send, receive, watch)]
        closing = asyncio.create_task(self._closing.wait())
        try:
            done, _ = await asyncio.wait([*tasks, closing], return_when=asyncio.FIRST_COMPLETED)
        finally:
            with self._cond:
                self.connected = False
                self._outbox = None
                self._sent.clear()  # what is still awaited will not come: comfort noise, counted late
                self._answers.clear()
                self._cond.notify_all()
            for task in [*tasks, closing]:
                task.cancel()
        if closing in done:
            return "closed"
        exc = next((t.exception() for t in done if t is not closing and not t.cancelled()), None)
        return _describe(exc, self.url) if exc is not None else "the connection ended"
