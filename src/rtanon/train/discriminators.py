"""HiFi-GAN discriminators (Kong et al. 2020), used only in training.

- :class:`PeriodDiscriminator` / :class:`MultiPeriodDiscriminator` (MPD): the
  waveform folded into ``(T / p, p)`` for periods 2, 3, 5, 7, 11, then 2-D
  convolutions along time.
- :class:`ScaleDiscriminator` / :class:`MultiScaleDiscriminator` (MSD): grouped
  1-D convolutions on the waveform at 1x, 1/2x and 1/4x (average pooling).

Every discriminator maps audio ``(B, 1, T)`` float32 at 16 kHz to a list of
score tensors (one per sub-discriminator) and a list of feature-map lists
(for the feature-matching loss). Channel widths are configurable so tests can
use small ones; the defaults are HiFi-GAN's.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import nn

from rtanon.train.vocoder_config import DiscriminatorConfig  # noqa: F401  (the networks' sizes)

_wn = nn.utils.parametrizations.weight_norm
_sn = nn.utils.parametrizations.spectral_norm


class PeriodDiscriminator(nn.Module):
    def __init__(self, period: int, channels: tuple[int, ...], kernel: int = 5, stride: int = 3) -> None:
        super().__init__()
        self.period = period
        pad = (kernel - 1) // 2
        c_in = 1
        layers = []
        for i, c in enumerate(channels):
            s = stride if i < len(channels) - 1 else 1
            layers.append(_wn(nn.Conv2d(c_in, c, (kernel, 1), (s, 1), padding=(pad, 0))))
            c_in = c
        self.convs = nn.ModuleList(layers)
        self.conv_post = _wn(nn.Conv2d(c_in, 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, c, t = x.shape
        if t % self.period:
            n_pad = self.period - t % self.period
            x = F.pad(x, (0, n_pad), "reflect" if t > n_pad else "constant")
            t = t + n_pad
        x = x.view(b, c, t // self.period, self.period)
        return _conv_stack(x, self.convs, self.conv_post)


def _conv_stack(x: torch.Tensor, convs: nn.ModuleList, conv_post: nn.Module):
    """Leaky-ReLU conv layers then the output conv; returns (flattened logits, feature maps)."""
    fmap = []
    for conv in convs:
        x = F.leaky_relu(conv(x), 0.1)
        fmap.append(x)
    x = conv_post(x)
    fmap.append(x)
    return torch.flatten(x, 1, -1), fmap


class ScaleDiscriminator(nn.Module):
    _kernels = (15, 41, 41, 41, 41, 41, 5)
    _strides = (1, 2, 2, 4, 4, 1, 1)
    _groups = (1, 4, 16, 16, 16, 16, 1)

    def __init__(self, channels: tuple[int, ...], spectral_norm: bool = False) -> None:
        super().__init__()
        norm = _sn if spectral_norm else _wn
        c_in = 1
        layers = []
        for c, k, s, g in zip(channels, self._kernels, self._strides, self._groups):
            g = math.gcd(math.gcd(c_in, c), g)
            layers.append(norm(nn.Conv1d(c_in, c, k, s, groups=g, padding=(k - 1) // 2)))
            c_in = c
        self.convs = nn.ModuleList(layers)
        self.conv_post = norm(nn.Conv1d(c_in, 1, 3, 1, padding=1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return _conv_stack(x, self.convs, self.conv_post)


class MultiPeriodDiscriminator(nn.Module):
    def __init__(self, config: DiscriminatorConfig) -> None:
        super().__init__()
        self.discriminators = nn.ModuleList(PeriodDiscriminator(p, config.mpd_channels) for p in config.periods)

    def forward(self, audio: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        outs = [d(audio) for d in self.discriminators]
        return [o[0] for o in outs], [o[1] for o in outs]


class MultiScaleDiscriminator(nn.Module):
    def __init__(self, config: DiscriminatorConfig) -> None:
        super().__init__()
        self.discriminators = nn.ModuleList(ScaleDiscriminator(config.msd_channels, spectral_norm=i == 0)
                                            for i in range(config.msd_scales))
        self.pool = nn.AvgPool1d(4, 2, padding=2)

    def forward(self, audio: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        scores, fmaps = [], []
        x = audio
        for i, d in enumerate(self.discriminators):
            if i:
                x = self.pool(x)
            s, f = d(x)
            scores.append(s)
            fmaps.append(f)
        return scores, fmaps


class Discriminators(nn.Module):
    """MPD and MSD together: ``audio (B, 1, T)`` -> (scores, feature maps) of all sub-discriminators."""

    def __init__(self, config: DiscriminatorConfig | None = None) -> None:
        super().__init__()
        config = config or DiscriminatorConfig()
        config.validate()
        self.mpd = MultiPeriodDiscriminator(config)
        self.msd = MultiScaleDiscriminator(config)

    def forward(self, audio: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        s1, f1 = self.mpd(audio)
        s2, f2 = self.msd(audio)
        return s1 + s2, f1 + f2


class _ReverseGradient(torch.autograd.Function):
    """Identity forward, negated gradient backward (Ganin & Lempitsky 2015)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return -grad


def reverse_gradient(x: torch.Tensor) -> torch.Tensor:
    return _ReverseGradient.apply(x)

