"""Streaming stages: one class per stage, all with the same small contract.

Every stage processes 16 kHz mono float32 audio one chunk at a time:

- ``process(chunk) -> out``: ``chunk`` is a 1-D float32 array of exactly
  ``hop`` samples in [-1, 1]; ``out`` is the stage's result for that chunk
  (audio of the same length for audio stages, a decision for the VAD).
- ``reset()``: forget all history (buffers, filter states), keep configuration
  and the per-session voice.
- ``hop``: samples per call (read-only).
- ``latency_samples``: algorithmic delay the stage adds (read-only); the
  engine adds these up, so the latency is computed, not claimed.

Modules: ``base`` (the contract), ``vad`` (webrtcvad with hangover),
``mcadams`` (McAdams-coefficient anonymization; its kernels in
``mcadams_kernels``), ``allpass`` (random all-pass sections after a method),
``neural`` (the neural voice: content encoder, F0 tracker, pitch mapping and
vocoder as one composite stage).
"""

from rtanon.stages.base import Stage, check_chunk

__all__ = ["Stage", "check_chunk"]
