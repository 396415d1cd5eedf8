"""Configuration dataclasses: one set of defaults, each with ``validate()``.

``AnonymizerConfig`` nests everything an :class:`rtanon.engine.Anonymizer`
needs: the stream format (``StreamConfig``), the VAD (``VadConfig``) and the
per-method settings (``McAdamsConfig``). Every ``validate()`` raises
``ConfigError`` with a message that says how to fix the value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rtanon.constants import SAMPLE_RATE_HZ  # noqa: F401  (the stream format's rate; defined once there)
from rtanon.errors import UserError

#: Chunk sizes the engine accepts, in ms (webrtcvad works on 10 ms frames).
ALLOWED_CHUNK_MS = (10, 20, 30, 40)
#: The neural method's operating points (``NeuralConfig.privacy``): the packaged content encoder and vocoder
#: each one runs.
PRIVACY_POINTS = ("balanced", "strong")
#: What the neural method's shipped content encoder reads (``NeuralConfig.context``): ``causal``, the live
#: path's (20 ms ahead), or ``utterance``, each whole utterance (files and corpora only).
CONTEXTS = ("causal", "utterance")


class ConfigError(UserError, ValueError):
    """A configuration value is out of range; the message says how to fix it."""


@dataclass(frozen=True)
class StreamConfig:
    """Chunking of the stream. ``chunk_ms`` is both the processing hop and the
    buffering delay it adds."""

    chunk_ms: int = 20

    @property
    def chunk_samples(self) -> int:
        return SAMPLE_RATE_HZ * self.chunk_ms // 1000

    def validate(self) -> None:
        if self.chunk_ms not in ALLOWED_CHUNK_MS:
            raise ConfigError(f"chunk_ms={self.chunk_ms} is not supported; use one of {ALLOWED_CHUNK_MS} "
                              "(10 to 40 ms in steps of 10 ms)")


@dataclass(frozen=True)
class VadConfig:
    """Voice activity detection (webrtcvad) and what non-speech becomes.

    ``aggressiveness`` 0..3 (3 rejects most non-speech); ``hangover_ms`` keeps
    the gate open after the last speech frame so word endings are not cut;
    ``comfort_noise_dbfs`` is the RMS level of the noise played instead of
    non-speech (``None`` plays digital silence). A 10 ms frame also counts as
    speech when it is ``energy_margin_db`` above the tracked noise floor and
    louder than ``energy_min_dbfs``.
    """

    aggressiveness: int = 2
    hangover_ms: int = 200
    comfort_noise_dbfs: float | None = -66.0
    energy_margin_db: float = 20.0
    energy_min_dbfs: float = -50.0

    def validate(self) -> None:
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ConfigError(f"VAD aggressiveness={self.aggressiveness}; use 0, 1, 2 or 3")
        if not 0 <= self.hangover_ms <= 2000:
            raise ConfigError(f"VAD hangover_ms={self.hangover_ms}; use 0 to 2000 ms")
        if not 6.0 <= self.energy_margin_db <= 60.0:
            raise ConfigError(f"VAD energy_margin_db={self.energy_margin_db}; use 6 to 60 dB")
        if not -90.0 <= self.energy_min_dbfs <= -10.0:
            raise ConfigError(f"VAD energy_min_dbfs={self.energy_min_dbfs}; use -90 to -10 dBFS")
        if self.comfort_noise_dbfs is not None and not -120.0 <= self.comfort_noise_dbfs <= -40.0:
            raise ConfigError(f"comfort_noise_dbfs={self.comfort_noise_dbfs}; use -120 to -40 dBFS, "
                              "or None for silence")


@dataclass(frozen=True)
class McAdamsConfig:
    """McAdams-coefficient anonymization (VoicePrivacy baseline B2).

    Each session draws its coefficient uniformly from
    [``alpha_min``, ``alpha_max``]; pole angles φ become φ**α. ``lpc_order``
    poles per ``window_ms`` frame, frames every ``window_ms / 2``.
    """

    alpha_min: float = 0.75
    alpha_max: float = 0.9
    lpc_order: int = 20
    window_ms: int = 20

    def validate(self) -> None:
        if not 0.5 <= self.alpha_min <= self.alpha_max <= 0.95:
            raise ConfigError(f"McAdams alpha range [{self.alpha_min}, {self.alpha_max}] must satisfy "
                              "0.5 <= alpha_min <= alpha_max <= 0.95 (alpha near 1 barely changes the voice)")
        if not 8 <= self.lpc_order <= 40:
            raise ConfigError(f"lpc_order={self.lpc_order}; use 8 to 40 (20 at 16 kHz is standard)")
        if self.window_ms not in (20,):
            raise ConfigError(f"window_ms={self.window_ms}; only 20 ms (10 ms hop) is supported")


@dataclass(frozen=True)
class NeuralConfig:
    """The ``neural`` method: content encoder + F0 tracker + pitch mapping + causal HiFi-GAN vocoder.

    ``backend`` runs the vocoder (``onnxruntime``: CPU default; ``torch``: CPU or CUDA; ``tensorrt``:
    NVIDIA GPUs with TensorRT installed); ``device`` "cpu", "cuda" or "auto"; ``threads``: ONNX
    Runtime's threads per call of the content encoder and the vocoder (1 live; a server's batched calls use more). A session without a pinned identity draws a fresh pseudo-speaker with ``strategy``
    ("gmm", paper 003, or a paper 000 proximity: random/dense/sparse) and ``gender`` (random/f/m).
    ``pitch_method``: percentile (default), log_gaussian or minmax (paper 000 Eq. 4-7).
    ``privacy`` picks the shipped content encoder and vocoder: ``balanced`` (the streaming Whisper tiny.en
    encoder: fewer lost words) or ``strong`` (content encoder version 4); see ``models/neural/MODEL_CARD.md``
    for both points' figures.
    ``context`` picks the shipped content encoder: ``causal`` (the live path's) or ``utterance`` (Whisper
    tiny.en's encoder over each whole utterance, with the vocoder trained on it: files and corpora only, one
    point, so ``privacy`` does not apply; ``models/neural/MODEL_CARD_UTTERANCE.md``).
    ``vocoder_onnx`` / ``vocoder_checkpoint``: other weights than the shipped ones; ``content_onnx``: another
    content encoder (the vocoder must have been trained on its output).
    The torch backend on CUDA runs the content encoder there too (its torch weights, beside its graph).
    ``cuda_graphs``: the torch backend's CUDA-graph replay on CUDA (one graph per batch bucket). ``match_loudness``: scale each 20 ms
    vocoder frame to the input frame's RMS (gain at most ``max_gain_db``, ramped across the frame), as
    RVC's volume-envelope mix does: quiet input stays quiet and the level follows the speaker's, whatever
    level the vocoder renders at."""

    backend: str = "onnxruntime"
    device: str = "cpu"
    threads: int = 1
    strategy: str = "gmm"
    gender: str = "random"
    pitch_method: str = "percentile"
    privacy: str = "balanced"
    context: str = "causal"
    vocoder_onnx: str | None = None
    vocoder_checkpoint: str | None = None
    content_onnx: str | None = None
    match_loudness: bool = True
    max_gain_db: float = 12.0
    #: torch backend on CUDA: replay the streaming step as a captured CUDA graph (about 6x faster per step
    #: at batch 1 on an H100; off only to measure that)
    cuda_graphs: bool = True

    def validate(self) -> None:
        if not 0.0 <= self.max_gain_db <= 40.0:
            raise ConfigError(f"max_gain_db={self.max_gain_db}; use 0 to 40 dB")
        backends = ("onnxruntime", "torch", "tensorrt")
        if self.backend not in backends:
            raise ConfigError(f"neural backend {self.backend!r}; choose one of {backends}")
        if self.device not in ("cpu", "cuda", "auto"):
            raise ConfigError(f"neural device {self.device!r}; use cpu, cuda or auto")
        if self.threads < 1:
            raise ConfigError(f"neural threads={self.threads}; use 1 (live) or more")
        if self.strategy not in ("gmm", "random", "dense", "sparse"):
            raise ConfigError(f"identity strategy {self.strategy!r}; use gmm, random, dense or sparse (near/far "
                              "need the user's voice: make the identity with `rtanon identity new --enroll` and "
                              "pass --identity)")
        if self.gender not in ("random", "f", "m"):
            raise ConfigError(f"gender {self.gender!r}; use random, f or m")
        if self.privacy not in PRIVACY_POINTS:
            raise ConfigError(f"privacy {self.privacy!r}; use one of {PRIVACY_POINTS}")
        if self.context not in CONTEXTS:
            raise ConfigError(f"context {self.context!r}; use one of {CONTEXTS}")
        if self.pitch_method not in ("percentile", "log_gaussian", "minmax"):
            raise ConfigError(f"pitch_method {self.pitch_method!r}; use percentile, log_gaussian or minmax")
        if self.vocoder_onnx and not str(self.vocoder_onnx).endswith(".onnx"):
            raise ConfigError(f"vocoder {self.vocoder_onnx}: the {self.backend} backend runs an ONNX graph "
                              "(OUT/vocoder.onnx of `rtanon train vocoder`); a generator.pt needs --backend torch")
        if self.vocoder_checkpoint and not str(self.vocoder_checkpoint).endswith(".pt"):
            raise ConfigError(f"vocoder {self.vocoder_checkpoint}: the torch backend loads a generator.pt "
                              "checkpoint; an ONNX graph needs --backend onnxruntime or tensorrt")
        if self.content_onnx and not str(self.content_onnx).endswith(".onnx"):
            raise ConfigError(f"content encoder {self.content_onnx}: give the ONNX graph that `rtanon lab "
                              "export-content` writes (a .onnx file)")


#: The anonymization methods, in the order the CLI lists them; :mod:`rtanon.methods` registers one class each.
METHOD_NAMES = ("mcadams", "neural")


@dataclass(frozen=True)
class AnonymizerConfig:
    """Everything an Anonymizer is built from. ``method`` is one of :data:`METHOD_NAMES` (the registry
    :data:`rtanon.methods.METHODS` builds each)."""

    method: str = "neural"
    #: random all-pass sections after the method (per session; 0 turns it off):
    #: the output waveform stops matching the input while the spectrum is kept
    allpass_sections: int = 8
    stream: StreamConfig = field(default_factory=StreamConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    mcadams: McAdamsConfig = field(default_factory=McAdamsConfig)
    neural: NeuralConfig = field(default_factory=NeuralConfig)

    def validate(self) -> None:
        if self.method not in METHOD_NAMES:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {sorted(METHOD_NAMES)}")
        if not 0 <= self.allpass_sections <= 32:
            raise ConfigError(f"allpass_sections={self.allpass_sections}; use 0 (off) to 32")
        self.stream.validate()
        self.vad.validate()
        self.mcadams.validate()
        self.neural.validate()
