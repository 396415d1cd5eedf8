"""Anonymization methods: a registry of factories, one per method name.

A method is built once per :class:`rtanon.engine.Anonymizer` (it may hold
shared, immutable models) and makes the per-session stages with
``make_stages(rng)``: the random generator decides the session's voice.
There is deliberately no pass-through method.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ, AnonymizerConfig
from rtanon.stages import Stage


class Method(Protocol):
    name: str

    def make_stages(self, rng: np.random.Generator) -> list[Stage]:
        """Stages for one session, applied in order to 16 kHz float32 chunks."""
        ...

    def describe_voice(self, stages: list[Stage]) -> dict:
        """What identifies the session's pseudo-voice (never the user's voice)."""
        ...


class McAdamsMethod:
    """VoicePrivacy B2: McAdams coefficient drawn per session."""

    name = "mcadams"

    def __init__(self, config: AnonymizerConfig) -> None:
        from rtanon.stages.mcadams import mcadams_frame

        self._config = config
        # compile (or load from Numba's cache) the kernels now, not in the first live chunk
        mcadams_frame(np.hanning(config.mcadams.window_ms * SAMPLE_RATE_HZ // 1000), 0.8, config.mcadams.lpc_order)

    def make_stages(self, rng: np.random.Generator) -> list[Stage]:
        from rtanon.stages.mcadams import McAdamsStage

        mc = self._config.mcadams
        alpha = rng.uniform(mc.alpha_min, mc.alpha_max)
        return [McAdamsStage(mc, self._config.stream.chunk_samples, alpha)]

    def describe_voice(self, stages: list[Stage]) -> dict:
        return {"method": self.name, "alpha": round(stages[0].alpha, 4)}


#: Method name -> factory taking the AnonymizerConfig.
METHODS: dict[str, Callable[[AnonymizerConfig], Method]] = {
    "mcadams": McAdamsMethod,
}
