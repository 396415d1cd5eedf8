"""``rtanon connect``'s session: the live loop's engine :class:`rtanon.engine.Session`, computed by an
``rtanon serve`` server instead of local models.

:class:`RemoteSession` has what :class:`rtanon.live.core.LiveCore` and :func:`rtanon.live.loop.run_live` use of a
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
reconnects after a pause that doubles, with jitter, up to ``retry_max_s`` (back to the shortest after a
connection that held), and the new session draws a fresh voice unless an identity pins it.

It trusts the server with nothing it can check (fail closed): the first message must be a ready message
for the session asked for (:func:`rtanon.serve.client.check_ready`), or the connection counts as failed;
a server that sends more answers than frames, frames of another size or texts unasked is dropped; and an
answer that is a frame sent (:class:`EchoCheck`: copied, scaled, delayed) is never played: comfort noise
instead, and the session ends (``failed`` says why).
"""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from dataclasses import dataclass

import numpy as np

from rtanon.config import ConfigError, VadConfig
from rtanon.constants import FRAME_SAMPLES, SAMPLE_RATE_HZ
from rtanon.engine import PASSTHROUGH_CORRELATION, Counters
from rtanon.errors import UserError
from rtanon.paths import printable
from rtanon.stages.base import check_chunk

SEQ_MASK = 0xFFFFFFFF  # sequence numbers are uint32 on the wire
#: an answer louder than this (RMS) is speech: the server's comfort noise sits at -66 dBFS
SPEECH_RMS = 10.0 ** (-50.0 / 20.0)
#: an answer quieter than this (RMS, -80 dBFS, as the engine's pass-through guard) carries no voice to check
ECHO_MIN_RMS = 1e-4
#: an answer is the user's own frame sent back (never played, and the session ends) when its normalised
#: correlation with a window of what was sent reaches ECHO_CORRELATION (the engine's pass-through bar), or when
#: that window, best scaled, leaves at most ECHO_RESIDUAL_STEPS of it (RMS, PCM16 steps; rounding leaves at most
#: 0.5). Copies of so762_dev speech (as sent, half, -0.3 two frames late, 7 frames late) score 0.9996 to 1
#: and leave at most 0.33 steps. Real output against its own input, per 20 ms answer over the whole ring at the
#: default pipeline, PCM16 both ways (2026-12-01, a fresh voice per utterance): McAdams at its default alpha
#: 0.75-0.9 at most 0.9973 (all 320 so762_dev utterances, 62,167 answers; 0.9949 in a second run), at alpha 0.95,
#: the mildest allowed, 0.9984 (0.9977 in a second run); the neural method 0.9858 (balanced) and 0.9839 (strong)
#: on 40 utterances (7,730 answers each); none left less than 2.09 steps, and none was flagged.
ECHO_CORRELATION = PASSTHROUGH_CORRELATION
ECHO_RESIDUAL_STEPS = 1.0


#: a connection that held this long (seconds) was healthy: the next pause is the shortest again
HEALTHY_S = 5.0
RETRY_MIN_S = 0.2
#: answers beyond the frames sent on a connection (the server answers each frame once): past it, a flood
ANSWER_SLACK = 50
#: how far back (frames, beyond the pipeline) the echo check looks for the frame an answer repeats
ECHO_MEMORY_FRAMES = 50


class ConnectError(UserError):
    """The server cannot be reached or refused the session; the message says what to do."""


class EchoCheck:
    """Whether an answer is the user's own voice sent back. Each answer is compared with every 320-sample
    window of the last ``frames`` frames sent (as PCM16 on the wire), at every lag: its normalised
    correlation with the window most like it, and what is left of it once that window, best scaled, is
    taken away (RMS, in PCM16 steps). A frame sent back, scaled, sign-flipped or delayed by any number of
    samples within the ring leaves only the rounding (at most half a step a sample) and correlates at
    :data:`ECHO_CORRELATION` or more once it is above -71 dBFS. One FFT per answer."""

    def __init__(self, frames: int) -> None:
        self._hist = np.zeros(frames * FRAME_SAMPLES, np.float64)  # PCM16 steps

    def push(self, x: np.ndarray) -> None:
        """The frame just sent (``FRAME_SAMPLES`` float32 in [-1, 1]), rounded as the wire rounds it."""
        n = FRAME_SAMPLES
        self._hist[:-n] = self._hist[n:]
        self._hist[-n:] = np.round(np.clip(x, -1.0, 1.0) * 32767.0)

    def score(self, y: np.ndarray) -> tuple[int, float, float]:
        """``(lag, correlation, residual)`` of answer ``y`` (``FRAME_SAMPLES`` float32 in [-1, 1]) against
        the sent window most like it: how many samples that window ends before the newest one sent, the
        normalised correlation (0 to 1) and the residual RMS in PCM16 steps; ``(0, 0.0, inf)`` for an answer
        below :data:`ECHO_MIN_RMS`, too quiet to carry a voice."""
        import scipy.fft  # here, not at import: `rtanon --help` need not load it

        n, h = y.shape[0], self._hist.shape[0]
        y = y.astype(np.float64) * 32768.0
        ny = float(np.sqrt(np.dot(y, y)))
        if ny <= ECHO_MIN_RMS * 32768.0 * np.sqrt(n):
            return 0, 0.0, float("inf")
        nfft = scipy.fft.next_fast_len(h + n - 1, real=True)
        # dots[k] = <hist[k:k + n], y>: the window that ends h - n - k samples before the newest sample
        dots = scipy.fft.irfft(scipy.fft.rfft(self._hist, nfft) * np.conj(scipy.fft.rfft(y, nfft)), nfft)[: h - n + 1]
        energy = np.concatenate(([0.0], np.cumsum(self._hist**2)))
        norms = np.sqrt(np.maximum(energy[n:] - energy[:-n], 0.0))
        live = norms >= np.sqrt(n)  # windows of at least one step RMS (not the zeros before the first frame)
        corr = np.where(live, np.abs(dots) / np.maximum(norms * ny, 1e-30), 0.0)
        k = int(np.argmax(corr))
        c = min(float(corr[k]), 1.0)
        return h - n - k, c, ny * np.sqrt(1.0 - c * c) / np.sqrt(n)

    def echo(self, y: np.ndarray) -> str | None:
        """Why answer ``y`` is a frame sent (copied, scaled, delayed), or None."""
        lag, corr, residual = self.score(y)
        if corr >= ECHO_CORRELATION or residual <= ECHO_RESIDUAL_STEPS:
            return (f"correlation {corr:.4f} with what was sent {1000 * lag / SAMPLE_RATE_HZ:.0f} ms before the "
                    f"newest frame, {residual:.2f} PCM16 steps apart")
        return None


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

    from rtanon.serve.client import ServeRefused

    text = printable(str(exc) or type(exc).__name__, 240)
    if isinstance(exc, asyncio.TimeoutError):
        return f"{url} did not answer in time (is `rtanon serve` running there?)"
    if isinstance(exc, aiohttp.WSServerHandshakeError) or "refused: HTTP" in text:
        status = getattr(exc, "status", None) or text.rsplit(" ", 1)[-1]
        return {"401": "the server refused the token: --token-file must hold the token of the server's "
                       "own --token-file",
                "503": "the server is full (its --max-sessions); try again later",
                "404": f"{url} is not an rtanon serve WebSocket (the path is /ws)"}.get(
            str(status), f"the server refused the connection (HTTP {status})")
    if isinstance(exc, ServeRefused):  # the message says what the server did
        return f"{url}: {text}"
    if isinstance(exc, (aiohttp.ClientConnectorError, OSError)):
        return f"cannot reach {url}: {text} (is `rtanon serve` running there?)"
    return f"the connection to {url} failed: {text}"


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
        self.attempts = 0  # connection attempts since the last healthy connection
        self.retry_at: float | None = None  # when the next attempt starts (time.monotonic), while waiting
        self.failed = ""  # why the session ended for good (the server sent back the user's voice)
        self.late = 0  # frames sent whose answer was not back within pipeline_ms
        self.unsent = 0  # frames not sent (the server was away) or lost with a broken connection
        self.last_error = ""
        self.round_trip_s: collections.deque = collections.deque(maxlen=3000)
        level = VadConfig().comfort_noise_dbfs
        self._noise_rms = 0.0 if level is None else 10.0 ** (level / 20.0)
        self._noise_rng = np.random.default_rng()
        self._seq = 0
        self._echo = EchoCheck(self.pipeline_frames + ECHO_MEMORY_FRAMES)
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

    def _fail(self, why: str) -> None:
        """Ends the session for good: nothing more is sent or played, and the network thread stops."""
        with self._cond:
            if self.failed:
                return
            self.failed = why
            self.counters.last_error = why
        loop, closing = self._loop, self._closing
        if loop is not None and closing is not None:
            try:
                loop.call_soon_threadsafe(closing.set)
            except RuntimeError:  # the loop already ended
                pass

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
        self._echo.push(x)
        with self._cond:
            outbox = self._outbox
            if self.connected and outbox is not None and not self.failed:
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
        if y is not None and not self.failed and (echo := self._echo.echo(y)) is not None:
            self._fail(f"the server at {self.url} sent back your own voice (the answer to frame {due}: {echo}): it "
                       "is not an rtanon serve server, or a broken one; that answer and everything after it played "
                       "comfort noise, and the session ended")
        if self.failed:
            y = None
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
        if self.failed:
            return " | server FAILED: it sent back your voice, session ended"
        if not self.connected:
            retry_at = self.retry_at
            error = self.last_error.removeprefix(f"{self.url}: ")
            why = f": {printable(error, 80)}" if error else ""
            if retry_at is None:
                return f" | server DOWN{why}, connecting (attempt {self.attempts + 1})"
            return (f" | server DOWN{why}, retry {self.attempts + 1} in {max(0.0, retry_at - time.monotonic()):.1f} s "
                    f"(back-off up to {self.config.retry_max_s:.0f} s)")
        rtt = self.stats()["round_trip_ms_p50"]
        return f" | server rtt {rtt:.0f} ms" if rtt is not None else " | server up"

    async def _run(self) -> None:
        """The network thread: connect, pump frames until the connection ends, pause, reconnect. The pause
        doubles after each attempt that fails or connection that does not hold ``HEALTHY_S``, from
        ``RETRY_MIN_S`` up to ``retry_max_s``, each drawn from its upper half (jitter: many clients
        that lost one server do not come back at the same instant)."""
        from rtanon.serve.client import ServeClient

        self._closing = asyncio.Event()
        first = True
        while not self._closing.is_set():
            if not first:
                pause = min(RETRY_MIN_S * 2 ** max(0, self.attempts - 1), self.config.retry_max_s)
                pause *= random.uniform(0.5, 1.0)
                self.retry_at = time.monotonic() + pause
                try:
                    await asyncio.wait_for(self._closing.wait(), pause)
                    break
                except asyncio.TimeoutError:
                    pass
                self.retry_at = None
            self.attempts += 1
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
                continue
            self.reconnects += not first
            first = False
            t_open = time.monotonic()
            why, polite = await self._pump(client)
            self.last_error = why or self.last_error  # closing here is no error: the last one still tells
            if time.monotonic() - t_open >= HEALTHY_S:
                self.attempts = 0
            try:
                await asyncio.wait_for(client.close(polite), 2.0)
            except Exception:  # a dead connection may refuse a polite close
                pass
        self.retry_at = None
        self._first.set()

    async def _pump(self, client) -> tuple[str, bool]:
        """Sends the outbox and reads answers until the connection ends or stalls; returns why it ended, and
        whether the server may still get a polite bye (not when it broke the protocol); why is "" when this
        session was closed here."""
        from rtanon.serve.client import ServerBroke

        outbox: asyncio.Queue = asyncio.Queue()
        with self._cond:
            self.ready = client.ready
            self._outbox = outbox
            self._last_answer_t = self._last_sent_t = time.monotonic()
            self.connected = True
        self._first.set()

        sent_here = answered = 0

        async def send():
            nonlocal sent_here
            while True:
                seq, x = await outbox.get()
                await client.send(seq, x)
                sent_here += 1

        async def receive():
            nonlocal answered
            while True:
                seq, y = await client.receive(timeout=None)
                answered += 1
                if answered > sent_here + ANSWER_SLACK:
                    raise ServerBroke(f"the server floods: {answered} answers to {sent_here} frames sent")
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
            return "", True
        exc = next((t.exception() for t in done if t is not closing and not t.cancelled()), None)
        if exc is None:
            return "the connection ended", True
        return _describe(exc, self.url), not isinstance(exc, ServerBroke)