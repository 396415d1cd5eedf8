"""Anonymization methods: a registry of factories, one per method name.

A method is built once per :class:`rtanon.engine.Anonymizer` (it may hold
shared, immutable models) and makes the per-session stages with
``make_stages(rng, identity, unlike)``: the random generator decides the
session's voice, unless a pinned :class:`rtanon.identity.speaker.PseudoSpeaker`
does; ``unlike`` (the stages of a session of the same method) asks for a voice
clearly different from that one, as a user's "new voice" does. There is
deliberately no pass-through method.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Protocol

import numpy as np

from rtanon.config import METHOD_NAMES, AnonymizerConfig
from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.stages import Stage


class Method(Protocol):
    name: str

    def make_stages(self, rng: np.random.Generator, identity=None, unlike: list[Stage] | None = None) -> list[Stage]:
        """Stages for one session, applied in order to 16 kHz float32 chunks.
        ``identity`` (a PseudoSpeaker) pins the session's voice when given; otherwise a drawn
        voice keeps clearly away from ``unlike``'s (another session's stages of this method)."""
        ...

    def describe_voice(self, stages: list[Stage]) -> dict:
        """What identifies the session's pseudo-voice (never the user's voice)."""
        ...


#: A "new voice" keeps this far from the one it replaces: a quarter of McAdams' coefficient range, and
#: for a neural pseudo-speaker at most this cosine to the old embedding (resemblyzer scale: two different
#: speakers of the pool sit at a median 0.60, a speaker's own utterances at 0.78).
NEW_VOICE_MIN_ALPHA_GAP = 0.25
NEW_VOICE_MAX_COSINE = 0.6


def uniform_away_from(rng: np.random.Generator, lo: float, hi: float, old: float, gap: float) -> float:
    """Uniform on [lo, hi] without (old - gap, old + gap); the farther end when nothing is left."""
    left, right = max(0.0, min(old - gap, hi) - lo), max(0.0, hi - max(old + gap, lo))
    if left + right <= 0.0:
        return lo if old - lo > hi - old else hi
    u = rng.uniform(0.0, left + right)
    return lo + u if u < left else max(old + gap, lo) + (u - left)


def identity_seed(identity) -> int:
    """A seed fixed by a PseudoSpeaker's embedding: the same identity file gives
    the same voice in methods whose voice is a random draw (McAdams' alpha)."""
    digest = hashlib.sha256(np.asarray(identity.embedding, np.float32).tobytes()).digest()
    return int.from_bytes(digest[:8], "little")


def voice_tag(identity) -> str:
    """Four hex digits naming a pseudo-speaker (from its embedding, as :func:`identity_seed`): two voices
    that share a gender and median F0 still read differently on a control page or in a log."""
    return f"{identity_seed(identity) & 0xFFFF:04x}"


class McAdamsMethod:
    """VoicePrivacy B2: McAdams coefficient drawn per session (or fixed by a
    pinned identity: McAdams has no speaker embedding, so the identity's
    embedding seeds the draw)."""

    name = "mcadams"

    def __init__(self, config: AnonymizerConfig) -> None:
        from rtanon.stages.mcadams import mcadams_frame

        self._config = config
        # compile (or load from Numba's cache) the kernels now, not in the first live chunk
        mcadams_frame(np.hanning(config.mcadams.window_ms * SAMPLE_RATE_HZ // 1000), 0.8, config.mcadams.lpc_order)

    def make_stages(self, rng: np.random.Generator, identity=None, unlike: list[Stage] | None = None) -> list[Stage]:
        from rtanon.stages.mcadams import McAdamsStage

        mc = self._config.mcadams
        if identity is not None:
            alpha = np.random.default_rng(identity_seed(identity)).uniform(mc.alpha_min, mc.alpha_max)
        elif unlike:
            alpha = uniform_away_from(rng, mc.alpha_min, mc.alpha_max, unlike[0].alpha,
                                      NEW_VOICE_MIN_ALPHA_GAP * (mc.alpha_max - mc.alpha_min))
        else:
            alpha = rng.uniform(mc.alpha_min, mc.alpha_max)
        return [McAdamsStage(mc, self._config.stream.chunk_samples, alpha)]

    def describe_voice(self, stages: list[Stage]) -> dict:
        # six digits: two sessions drawn from a narrow range (0.05 wide) printed alike 1 time in 500 at four
        return {"method": self.name, "alpha": round(stages[0].alpha, 6)}


class NeuralMethod:
    """Content units + mapped F0 + a pseudo-speaker through the causal HiFi-GAN vocoder
    (harmonic-plus-noise source; :mod:`rtanon.stages.neural`). Each session draws a fresh PseudoSpeaker (GMM by
    default) unless one is pinned."""

    name = "neural"

    def __init__(self, config: AnonymizerConfig) -> None:
        from rtanon.stages.neural import NeuralVoiceModel

        self._config = config
        self.model = NeuralVoiceModel(config.neural)

    def make_stages(self, rng: np.random.Generator, identity=None, unlike: list[Stage] | None = None) -> list[Stage]:
        if identity is None:
            identity = self.model.new_identity(rng, unlike=unlike[0].identity.embedding if unlike else None,
                                               max_cosine=NEW_VOICE_MAX_COSINE)
        return [self.model.open_stream(self._config.stream.chunk_samples, identity, rng)]

    def describe_voice(self, stages: list[Stage]) -> dict:
        ident = stages[0].identity
        return {"method": self.name, "tag": voice_tag(ident), "gender": ident.gender,
                "median_f0_hz": round(ident.median_f0_hz, 1), "strategy": ident.strategy.get("name")}


#: Method name -> factory taking the AnonymizerConfig.
METHODS: dict[str, Callable[[AnonymizerConfig], Method]] = {
    "mcadams": McAdamsMethod,
    "neural": NeuralMethod,
}
assert tuple(METHODS) == METHOD_NAMES, "register every method of rtanon.config.METHOD_NAMES here, in order"


def voice_sentence(voice: dict) -> str:
    """A session's pseudo-voice (``Session.voice``) in a few words, as the CLI and the control page print it."""
    if voice.get("method") == "mcadams":
        text = f"McAdams, coefficient {voice['alpha']:.3f}"
    elif voice.get("method") == "neural":
        gender = {"f": "female", "m": "male"}.get(voice.get("gender"), str(voice.get("gender", "")))
        tag = f" {voice['tag']}" if "tag" in voice else ""
        text = f"{gender} pseudo-speaker{tag}, median F0 {voice.get('median_f0_hz', 0):.0f} Hz"
    else:
        text = ", ".join(f"{k} {v}" for k, v in voice.items())
    if "identity" in voice:
        text += " (pinned by an identity file)"
    return text
