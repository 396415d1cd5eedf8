"""``LiveConfig``: how the live loop queues processed audio for the output device, and its blocks,
buffers and resampler (one set of defaults, ``validate()``)."""

from __future__ import annotations

from dataclasses import dataclass

from rtanon.config import ConfigError


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
