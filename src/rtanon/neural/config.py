"""Configurations of the neural vocoder and its discriminators (no torch: the CLI reads their defaults)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rtanon.config import ConfigError
from rtanon.neural.rates import HOP_SAMPLES


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
    ``models/neural/README.md`` for the measurements)."""

    units_dim: int = 128
    speaker_dim: int = 256
    #: Eq. 1 temperature of the soft units the vocoder is trained on and must be fed (metadata: the graph
    #: does not use it; see ``rtanon.content.stream.sharpen_units``).
    units_temperature: float = 0.1
    #: What the content encoder feeds: "probs" = soft units (K = n_units, at ``units_temperature``), "z" = its
    #: unit-space projections (D = unit_dim), L2-normalised inside the graph (scaled by 4).
    units_kind: str = "probs"
    #: sha256 of the content encoder graph whose output the vocoder was trained on ("" = not recorded); the
    #: neural method refuses to pair the vocoder with another encoder, whose output it would render as noise
    content_sha256: str = ""
    #: The input's own log-mel spectrum as a second content input (:mod:`rtanon.neural.input_mel`): the last
    #: ``input_mel_bins`` channels of ``units`` are its frame's log-mel (0 = none: content from ``z`` alone),
    #: of which the graph keeps DCT coefficients 1..``input_cepstra``.
    input_mel_bins: int = 0
    input_cepstra: int = 16
    upsample_rates: tuple[int, ...] = (2, 5, 4, 4, 2)
    initial_channels: int = 256
    min_channels: int = 8
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    resblock_type: int = 2
    pre_kernel_size: int = 5
    #: Dilations of the residual causal convolutions (kernel 3) of the frame-rate pre-net at 50 Hz, after the
    #: input convolution: the content-to-spectrum mapping of one speaker is learnt there, cheaply. () = none
    #: (the step-10,200 model of the first CPU run had none).
    prenet_dilations: tuple[int, ...] = ()
    #: Log-mel bands of the pre-net's auxiliary head (training only: a frame-level mel L1 that teaches the
    #: pre-net fast; not part of the streaming graph). 0 = no head.
    aux_mel_bins: int = 0
    f0_kernel_size: int = 3
    post_kernel_size: int = 7
    #: Excitation: "nsf" = the fixed NSF sine-plus-noise source (the first CPU run's model), "envelope" = the
    #: :class:`EnvelopeSynth` harmonic-plus-noise synthesiser driven by two spectral envelopes the pre-net
    #: predicts per 10 ms frame; the upsampling stack then adds a learnt residual to the synthesised speech.
    source_type: str = "nsf"
    #: Envelope source: mel-spaced points (0-8 kHz) of each log-amplitude envelope, harmonics synthesised
    #: (those below 7.8 kHz), and taps of the per-frame noise FIR (linear phase, delay taps/2 samples).
    envelope_points: int = 48
    envelope_harmonics: int = 64
    noise_taps: int = 64
    num_harmonics: int = 8
    sine_amp: float = 0.1
    noise_std_voiced: float = 0.003
    log_f0_mean: float = math.log(150.0)
    log_f0_std: float = 0.5
    weight_norm: bool = True

    @property
    def input_width(self) -> int:
        """Channels of the ``units`` input: the content plus the input's log-mel, when used."""
        return self.units_dim + self.input_mel_bins

    def stage_channels(self) -> list[int]:
        return [max(self.initial_channels >> (i + 1), self.min_channels) for i in range(len(self.upsample_rates))]

    def validate(self) -> None:
        if math.prod(self.upsample_rates) != HOP_SAMPLES:
            raise ConfigError(f"upsample_rates={self.upsample_rates} multiply to {math.prod(self.upsample_rates)}; "
                              f"they must multiply to {HOP_SAMPLES} (16 kHz audio from 50 Hz frames)")
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
        if not 1 <= self.num_harmonics <= 64:
            raise ConfigError(f"num_harmonics={self.num_harmonics}; use 1 to 64")
        if any(int(d) < 1 for d in self.prenet_dilations) or not 0 <= self.aux_mel_bins <= 256:
            raise ConfigError(f"prenet_dilations={self.prenet_dilations}, aux_mel_bins={self.aux_mel_bins}; "
                              "dilations must be >= 1 and aux_mel_bins 0 (none) to 256")
        if self.aux_mel_bins and not self.prenet_dilations:
            raise ConfigError("aux_mel_bins needs a pre-net: set prenet_dilations too (e.g. (1, 2, 4, 1))")
        if self.input_mel_bins and not (8 <= self.input_mel_bins <= 128
                                        and 1 <= self.input_cepstra < self.input_mel_bins):
            raise ConfigError(f"input_mel_bins={self.input_mel_bins}, input_cepstra={self.input_cepstra}; use 0 "
                              "(no input spectrum) or 8-128 bands, with 1 <= cepstra < bands")
        if self.units_kind not in ("probs", "z"):
            raise ConfigError(f"units_kind={self.units_kind!r}; use 'probs' (soft units) or 'z' (the content "
                              "encoder's unit-space projections)")
        if self.source_type not in ("nsf", "envelope"):
            raise ConfigError(f"source_type={self.source_type!r}; use 'nsf' (fixed sine source) or 'envelope' "
                              "(harmonic-plus-noise synthesis from predicted spectral envelopes)")
        if not 8 <= self.envelope_points <= 128 or not 1 <= self.envelope_harmonics <= 256 \
                or self.noise_taps not in (16, 32, 64, 128):
            raise ConfigError(f"envelope_points={self.envelope_points}, envelope_harmonics="
                              f"{self.envelope_harmonics}, noise_taps={self.noise_taps}; use 8-128 points, 1-256 "
                              "harmonics and 16, 32, 64 or 128 taps")
        if min(self.pre_kernel_size, self.f0_kernel_size, self.post_kernel_size) < 1:
            raise ConfigError("pre/f0/post kernel sizes must be >= 1")


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
