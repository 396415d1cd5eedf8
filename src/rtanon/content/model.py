"""The causal content encoder network (torch), with explicit streaming state.

``ContentEncoder(cfg)`` maps 16 kHz mono audio to 50 Hz soft speech units:

    audio (B, N) float32 in [-1, 1], N a multiple of 320 (20 ms)
      -> log-mel front end inside the graph: 25 ms Hann window, 10 ms hop,
         each frame's window ending at its hop's last sample (no lookahead)
      -> causal conv (100 Hz) -> stride-2 conv to 50 Hz -> residual causal
         dilated convs (pre-norm over channels) -> optional 1-layer GRU
         -> linear projection z (B, N/320, D)
      -> soft units p (B, N/320, K): paper 002 Eq. 1,
         softmax_i(cos(z, w_i) / tau) over K learned unit embeddings w_i.

State is passed in and out explicitly (KoeAI/LLVC style): ``init_state(B)``
returns the tuple, ``forward(audio, *state)`` returns
``(probs, z, *new_state)``. Feeding an utterance in 20 ms pieces with the
state threaded through gives the same result as one offline call (the graph
contains no operation that looks across a chunk boundary other than through
the state). The same graph exports to ONNX (``rtanon.train.export``).

The network itself is causal. With ``cfg.lookahead_frames`` = L > 0 it is
trained so that its output ``t + L`` is frame ``t``'s units (each frame hears
L frames past it); the readers (``rtanon.content.stream``) shift by L.
"""

from __future__ import annotations

import math
import torch
from torch import nn
from torch.nn import functional as F

from rtanon.constants import HOP_SAMPLES
from rtanon.content.config import N_FFT, WIN_SAMPLES, ContentModelConfig
from rtanon.neural.input_mel import mel_filterbank

class CausalConv(nn.Module):
    """Conv1d over (B, C, T) with its left context ``(B, C_in, (k-1)*dilation)`` as explicit state."""

    def __init__(self, c_in: int, c_out: int, k: int, dilation: int = 1) -> None:
        super().__init__()
        self.context = (k - 1) * dilation
        self.conv = nn.Conv1d(c_in, c_out, k, dilation=dilation)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xx = torch.cat([state, x], dim=2)
        return self.conv(xx), xx[:, :, xx.shape[2] - self.context:]


class ChannelNorm(nn.Module):
    """LayerNorm over the channels of (B, C, T), per frame (causal)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.ones(c, 1))
        self.b = nn.Parameter(torch.zeros(c, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.mean(1, keepdim=True)
        v = ((x - m) ** 2).mean(1, keepdim=True)
        return (x - m) / torch.sqrt(v + 1e-5) * self.g + self.b


class ContentEncoder(nn.Module):
    """See the module docstring. Shapes: audio (B, N) -> probs (B, N/320, K), z (B, N/320, D)."""

    def __init__(self, cfg: ContentModelConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or ContentModelConfig()
        cfg.validate()
        self.cfg = cfg
        n_bins = N_FFT // 2 + 1
        t = torch.arange(WIN_SAMPLES, dtype=torch.float64)
        window = 0.5 - 0.5 * torch.cos(2 * math.pi * t / WIN_SAMPLES)
        f = torch.arange(n_bins, dtype=torch.float64)[:, None]
        ang = 2 * math.pi * f * t[None, :] / N_FFT
        dft = torch.cat([torch.cos(ang) * window, -torch.sin(ang) * window], 0)  # (2*n_bins, WIN)
        self.register_buffer("dft", dft.float()[:, None, :], persistent=False)
        self.register_buffer("mel_fb", torch.from_numpy(mel_filterbank(cfg.n_mels)), persistent=False)
        # fixed input normalisation (set from training data before training)
        self.register_buffer("feat_mean", torch.zeros(cfg.n_mels))
        self.register_buffer("feat_std", torch.ones(cfg.n_mels))
        C = cfg.channels
        self.conv_in = CausalConv(cfg.n_mels, C, 3)
        self.down = nn.Conv1d(C, C, 2, stride=2)  # pairs of 10 ms frames, always chunk-aligned
        self.norms = nn.ModuleList([ChannelNorm(C) for _ in cfg.dilations])
        self.res = nn.ModuleList([CausalConv(C, C, 3, int(d)) for d in cfg.dilations])
        self.out_norm = ChannelNorm(C)
        self.gru = nn.GRU(C, cfg.gru_units, batch_first=True) if cfg.gru_units else None
        self.proj = nn.Linear(cfg.gru_units or C, cfg.unit_dim)
        self.units = nn.Parameter(torch.randn(cfg.n_units, cfg.unit_dim) * 0.1)

    # ---- state ---------------------------------------------------------------
    def state_shapes(self, batch: int = 1) -> list[tuple[int, ...]]:
        c = self.cfg
        shapes = [(batch, WIN_SAMPLES - HOP_SAMPLES), (batch, c.n_mels, 2)]
        if c.cmn_frames:
            shapes += [(batch, c.n_mels, c.cmn_frames - 1)]
        shapes += [(batch, c.channels, 2 * int(d)) for d in c.dilations]
        if c.gru_units:
            shapes += [(1, batch, c.gru_units)]
        return shapes

    def state_names(self) -> list[str]:
        return (["wav_state", "mel_state"] + (["cmn_state"] if self.cfg.cmn_frames else [])
                + [f"res{i}_state" for i in range(len(self.cfg.dilations))]
                + (["gru_state"] if self.cfg.gru_units else []))

    def init_state(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """Zero state: (wav (B,240), mel (B,n_mels,2), [cmn (B,n_mels,W-1)], res_i (B,C,2*dilation_i)...,
        [gru (1,B,H)]), float32."""
        return tuple(torch.zeros(s) for s in self.state_shapes(batch))

    # ---- pieces ---------------------------------------------------------------
    def log_mel(self, audio: torch.Tensor, wav_state: torch.Tensor,
                mel_fb: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """audio (B, N) -> normalised log-mel (B, n_mels, N/160), new wav_state (B, 240).

        ``mel_fb`` (B, n_mels, 257) overrides the filterbank (training augmentation)."""
        x = torch.cat([wav_state, audio], dim=1)
        spec = F.conv1d(x[:, None, :], self.dft, stride=HOP_SAMPLES)  # (B, 2*bins, T)
        nb = spec.shape[1] // 2
        power = spec[:, :nb] ** 2 + spec[:, nb:] ** 2
        if mel_fb is None:
            mel = torch.matmul(self.mel_fb, power)
        else:
            mel = torch.bmm(mel_fb, power)
        logmel = torch.log(mel + 1e-6)
        logmel = (logmel - self.feat_mean[:, None]) / self.feat_std[:, None]
        return logmel, x[:, x.shape[1] - (WIN_SAMPLES - HOP_SAMPLES):]

    def soft_units(self, z: torch.Tensor) -> torch.Tensor:
        """Paper 002 Eq. 1 logits: cos(z, w_i) / tau, (B, T, K)."""
        zn = z / torch.sqrt((z * z).sum(-1, keepdim=True) + 1e-8)
        w = self.units
        wn = w / torch.sqrt((w * w).sum(-1, keepdim=True) + 1e-8)
        return torch.matmul(zn, wn.t()) / self.cfg.temperature

    def encode_logmel(self, logmel: torch.Tensor, state: tuple[torch.Tensor, ...]):
        """logmel (B, n_mels, 2T) and the non-audio state -> (logits, z, new state)."""
        mel_state, *rest = state
        new_cmn = []
        if self.cfg.cmn_frames:
            logmel, cmn = self.mean_normalise(logmel, rest[0])
            rest, new_cmn = rest[1:], [cmn]
        n_res = len(self.res)
        res_states, gru_states = rest[:n_res], rest[n_res:]
        h, new_mel = self.conv_in(logmel, mel_state)
        h = F.gelu(h)
        h = F.gelu(self.down(h))
        new_res = []
        for norm, layer, st in zip(self.norms, self.res, res_states):
            r, ns = layer(norm(h), st)
            h = h + F.gelu(r)
            new_res.append(ns)
        y = self.out_norm(h).transpose(1, 2)
        new_gru = []
        if self.gru is not None:
            y, g = self.gru(y, gru_states[0])
            new_gru.append(g)
        z = self.proj(y)
        return self.soft_units(z), z, (new_mel, *new_cmn, *new_res, *new_gru)

    def mean_normalise(self, logmel: torch.Tensor, cmn_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal mean normalisation (``cfg.cmn_frames`` = W): each frame minus the mean of the last W frames,
        itself included; ``cmn_state`` holds the W - 1 frames before ``logmel``. -> (normalised, new state)."""
        w = self.cfg.cmn_frames
        xx = torch.cat([cmn_state, logmel], dim=2)
        mean = F.avg_pool1d(xx, w, stride=1)  # (B, n_mels, T): window ending at each frame of logmel
        return logmel - mean, xx[:, :, xx.shape[2] - (w - 1):]

    def forward(self, audio: torch.Tensor, *state: torch.Tensor):
        """audio (B, N) float32 16 kHz, N % 320 == 0; state from ``init_state``.

        Returns (probs (B, N/320, K), z (B, N/320, D), *new_state)."""
        wav_state, *rest = state
        logmel, new_wav = self.log_mel(audio, wav_state)
        logits, z, new_rest = self.encode_logmel(logmel, tuple(rest))
        return (torch.softmax(logits, dim=-1), z, new_wav, *new_rest)
