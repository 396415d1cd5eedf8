"""The neural vocoder's configuration (no torch: the CLI and the ONNX backends read it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rtanon.config import ConfigError
from rtanon.constants import FRAME_SAMPLES


@dataclass(frozen=True)
class VocoderConfig:
    """Shape of the generator. Channel width of stage ``i`` (output of the
    ``i``-th upsampling) is ``max(initial_channels >> (i + 1), min_channels)``.
    Every transposed convolution has kernel ``2 * rate``.

    The defaults use HiFi-GAN V3's residual blocks (type 2, kernels 3/5/7,
    dilations (1,2)/(2,6)/(3,12)) with 256 initial channels: about 1.3 M
    parameters (5 MiB fp32), chosen because the V1/V2 blocks (type 1,
    3/7/11 x (1,3,5)) at 192 channels took about 1.7x as long per 20 ms step
    (minimum over calls) with ONNX Runtime on the 2-core development machine
    and three times as many graph nodes, which dominates under load (see
    ``models/neural/MODEL_CARD.md`` for the measurements)."""

    #: Width of the content input: the content encoder's unit-space projections ``z`` (D = 256), L2-normalised
    #: inside the graph (scaled by 4).
    units_dim: int = 256
    speaker_dim: int = 256
    #: sha256 of the content encoder graph whose output the vocoder was trained on ("" = not recorded: the
    #: packaged encoder); the neural method refuses to pair the vocoder with another encoder, whose output it
    #: would render as noise
    content_sha256: str = ""
    upsample_rates: tuple[int, ...] = (2, 5, 4, 4, 2)
    initial_channels: int = 256
    min_channels: int = 8
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    resblock_type: int = 2
    pre_kernel_size: int = 5
    #: Dilations of the residual causal convolutions (kernel 3) of the frame-rate pre-net at 50 Hz, after the
    #: input convolution: the content-to-spectrum mapping is learnt there, cheaply.
    prenet_dilations: tuple[int, ...] = (1, 2, 4, 8, 1, 1)
    f0_kernel_size: int = 3
    post_kernel_size: int = 7
    #: The excitation is the ``EnvelopeSynth`` harmonic-plus-noise synthesiser driven by two spectral
    #: envelopes the pre-net predicts per 10 ms frame: mel-spaced points (0-8 kHz) of each log-amplitude
    #: envelope, harmonics synthesised (those below 7.8 kHz), and taps of the per-frame noise FIR (linear
    #: phase, delay taps/2 samples). The upsampling stack adds a learnt residual to the synthesised speech.
    envelope_points: int = 48
    envelope_harmonics: int = 64
    noise_taps: int = 64
    #: Normalisation of the log-F0 conditioning (the shipped model's: the log of its training F0 mean).
    log_f0_mean: float = 5.0106352940962555
    log_f0_std: float = 0.5
    weight_norm: bool = True

    #: Keys of retired configurations (the NSF source, soft-unit input: removed on 2026-11-25; the input
    #: spectrum: 2026-12-03) with the one value each may still hold in a checkpoint or graph this version can
    #: run (None: any).
    RETIRED = {"units_temperature": None, "units_kind": "z", "source_type": "envelope", "aux_mel_bins": 0,
               "num_harmonics": None, "sine_amp": None,
               "noise_std_voiced": None, "input_mel_bins": 0, "input_cmn_frames": 0, "input_cepstra": None}

    @classmethod
    def from_dict(cls, saved: dict) -> "VocoderConfig":
        """The config stored in a ``generator.pt`` or an ONNX graph's metadata (lists become tuples). One made
        with a retired option (the input spectrum among them) is refused with a ``ConfigError``."""
        def tuplify(v):
            return tuple(tuplify(x) for x in v) if isinstance(v, (list, tuple)) else v

        fields = {}
        for key, value in saved.items():
            if key in cls.RETIRED:
                keep = cls.RETIRED[key]
                if keep is not None and value != keep:
                    raise ConfigError(f"this vocoder was trained with {key}={value!r}, an option this version of "
                                      f"rtanon no longer runs (only {key}={keep!r}); retrain it with "
                                      "`rtanon train vocoder`")
            else:
                fields[key] = tuplify(value)
        return cls(**fields)

    def stage_channels(self) -> list[int]:
        return [max(self.initial_channels >> (i + 1), self.min_channels) for i in range(len(self.upsample_rates))]

    def validate(self) -> None:
        if math.prod(self.upsample_rates) != FRAME_SAMPLES:
            raise ConfigError(f"upsample_rates={self.upsample_rates} multiply to {math.prod(self.upsample_rates)}; "
                              f"they must multiply to {FRAME_SAMPLES} (16 kHz audio from 50 Hz frames)")
        if self.upsample_rates[0] != 2:
            raise ConfigError(f"upsample_rates[0]={self.upsample_rates[0]}; it must be 2 so that the first stage "
                              "runs at 100 Hz, where the F0 conditioning joins")
        if not 8 <= self.initial_channels <= 1024 or not 1 <= self.min_channels <= self.initial_channels:
            raise ConfigError(f"initial_channels={self.initial_channels}, min_channels={self.min_channels}; "
                              "use 8 <= min_channels <= initial_channels <= 1024 (128-192 runs in real time on CPU)")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilations) or not self.resblock_kernel_sizes:
            raise ConfigError("resblock_kernel_sizes and resblock_dilations need one entry per residual block, "
                              f"got {len(self.resblock_kernel_sizes)} and {len(self.resblock_dilations)}")
        if self.resblock_type not in (1, 2):
            raise ConfigError(f"resblock_type={self.resblock_type}; use 1 (HiFi-GAN V1/V2: two convolutions per "
                              "dilation) or 2 (V3: one convolution per dilation, cheaper)")
        if self.units_dim < 1 or self.speaker_dim < 1:
            raise ConfigError(f"units_dim={self.units_dim}, speaker_dim={self.speaker_dim}; both must be >= 1")
        if not self.prenet_dilations or any(int(d) < 1 for d in self.prenet_dilations):
            raise ConfigError(f"prenet_dilations={self.prenet_dilations}; the envelopes are predicted by the "
                              "pre-net: give one or more dilations >= 1")
        if not 8 <= self.envelope_points <= 128 or not 1 <= self.envelope_harmonics <= 256 \
                or self.noise_taps not in (16, 32, 64, 128):
            raise ConfigError(f"envelope_points={self.envelope_points}, envelope_harmonics="
                              f"{self.envelope_harmonics}, noise_taps={self.noise_taps}; use 8-128 points, 1-256 "
                              "harmonics and 16, 32, 64 or 128 taps")
        if min(self.pre_kernel_size, self.f0_kernel_size, self.post_kernel_size) < 1:
            raise ConfigError("pre/f0/post kernel sizes must be >= 1")
