"""The output path of the live loop: one output device's queue of processed audio (the adaptive jitter
buffer ``LiveConfig`` describes), its resampler from 16 kHz, and the comfort noise it plays when the worker
is late. ``play`` runs in the device callback, ``push`` in the worker."""

from __future__ import annotations

import time

import numpy as np
import soxr

from rtanon.config import SAMPLE_RATE_HZ
from rtanon.engine import Session
from rtanon.live.config import LiveConfig
from rtanon.live.recent import RecentValues
from rtanon.live.ring_buffer import RingBuffer


def resample_block(x: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    return x if from_hz == to_hz else soxr.resample(x, from_hz, to_hz).astype(np.float32)


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
            resample_block(session.comfort_noise(SAMPLE_RATE_HZ), SAMPLE_RATE_HZ, self.rate_hz))
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
