"""The vocoder's training configuration: the shipped recipe as defaults (no torch: the CLI reads them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rtanon.config import ConfigError
from rtanon.constants import FRAME_SAMPLES
from rtanon.neural.config import VocoderConfig


@dataclass(frozen=True)
class DiscriminatorConfig:
    periods: tuple[int, ...] = (2, 3, 5, 7, 11)
    mpd_channels: tuple[int, ...] = (32, 128, 512, 1024, 1024)
    msd_channels: tuple[int, ...] = (128, 128, 256, 512, 1024, 1024, 1024)
    msd_scales: int = 3

    def validate(self) -> None:
        if not self.periods or min(self.periods) < 2:
            raise ConfigError(f"periods={self.periods}; use periods >= 2 (HiFi-GAN: 2, 3, 5, 7, 11)")
        if len(self.mpd_channels) != 5 or len(self.msd_channels) != 7:
            raise ConfigError("mpd_channels needs 5 widths and msd_channels 7 (HiFi-GAN layer counts)")
        if not 1 <= self.msd_scales <= 4:
            raise ConfigError(f"msd_scales={self.msd_scales}; use 1 to 4")


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters: the recipe of the shipped vocoder (HiFi-GAN's optimiser settings)."""

    vocoder: VocoderConfig = field(default_factory=VocoderConfig)
    discriminators: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)
    steps: int = 200_000
    batch_size: int = 16
    segment_frames: int = 32  # 0.64 s
    context_frames: int = 4  # left out of the losses (zero-state warm-up)
    learning_rate: float = 1e-3
    adam_betas: tuple[float, float] = (0.8, 0.99)
    lr_decay: float = 0.999  # per lr_decay_every steps
    lr_decay_every: int = 1000
    #: step at which the MPD/MSD adversarial and feature-matching losses join; None: 0 on CUDA, never on a CPU
    adversarial_start_step: int | None = None
    #: steps trained on the synthesised speech alone (the upsampling stack is not run, so a step costs about
    #: half); the stack's residual joins at this step
    residual_start_step: int = 4000
    #: probability of blending an item's speaker embedding with another training speaker's
    blend_prob: float = 0.2
    grad_clip: float = 1000.0
    #: weight of 1 - cos(z(output), z(target)) per 20 ms frame, both from the frozen content encoder run from
    #: the zero state over the segment's loss frames (0 = off). The mel and STFT losses weigh every band
    #: alike; this one weighs what the encoder (distilled from an ASR model) hears.
    content_loss_weight: float = 0.0
    checkpoint_every: int = 200
    keep_checkpoints: int = 5
    log_every: int = 50
    seed: int = 0
    amp: bool = True  # CUDA only

    def validate(self) -> None:
        self.vocoder.validate()
        self.discriminators.validate()
        if not 0 <= self.context_frames < self.segment_frames:
            raise ConfigError(f"context_frames={self.context_frames} must be in [0, segment_frames="
                              f"{self.segment_frames})")
        if (self.segment_frames - self.context_frames) * FRAME_SAMPLES <= 1024:
            raise ConfigError(f"segment_frames - context_frames = {self.segment_frames - self.context_frames}; "
                              "use at least 4 frames of loss (the 2048-point STFT of the MR-STFT loss needs more "
                              "than 1024 samples)")
        if self.batch_size < 1 or self.steps < 1 or self.checkpoint_every < 1 or self.log_every < 1:
            raise ConfigError("batch_size, steps, checkpoint_every and log_every must be >= 1")
        if self.content_loss_weight < 0:
            raise ConfigError(f"content_loss_weight={self.content_loss_weight}; use 0 (off) or more")
        if not 0.0 <= self.blend_prob <= 1.0:
            raise ConfigError(f"blend_prob={self.blend_prob}; use a probability in [0, 1]")

    def to_json(self) -> dict:
        return asdict(self)
