"""The neural method's vocoder: harmonic-plus-noise synthesis from predicted spectral envelopes, refined by
a causal HiFi-GAN upsampling stack, with explicit streaming state.

A 50 Hz pre-net reads the content (the content encoder's projections ``z``) and the speaker vector and
predicts, per 10 ms, a harmonic and a noise spectral envelope; :class:`EnvelopeSynth` renders them as
harmonics of the given F0 plus filtered noise (DDSP / neural homomorphic vocoder style), so the pitch is
exactly the F0 asked for and the formants stay where the envelopes put them. That speech feeds the
generator of HiFi-GAN (Kong et al. 2020: transposed-convolution upsampling, each followed by a
multi-receptive-field fusion of residual blocks), made causal and conditioned the SSL-SAS way (Miao et
al. 2022, Sec. 3.4) on the F0 and the speaker, as its excitation; the stack adds a learnt residual to it
(zero at initialisation).

Rates: 50 Hz conditioning frames, 16 kHz audio, x320 in total. With the
default ``upsample_rates=(2, 5, 4, 4, 2)`` the stages run at 100 Hz, 500 Hz,
2 kHz, 8 kHz and 16 kHz; the 100 Hz F0 conditioning joins after the first
(x2) stage.

Inputs of one call (``L`` frames of 20 ms; ``B`` sessions):

- ``units``: ``(B, L, D)`` float32, the content encoder's projections ``z`` at 50 Hz.
- ``f0_hz``: ``(B, 2L)`` float32, F0 in Hz at 100 Hz, 0 where unvoiced.
- ``speaker``: ``(B, S)`` float32, the pseudo-speaker embedding (S = 256),
  fixed for a session.
- ``noise``: ``(B, 320 L)`` float32, standard-normal noise for the noise
  branch. It is an input (as in RVC's ONNX export) so that the graph is
  deterministic and chunked output equals offline output exactly; the
  per-session stream draws it from the session's random generator.

Output: ``(B, 320 L)`` float32 audio at 16 kHz in (-1, 1) (tanh).

Streaming (KoeAI/LLVC style): ``init_state(batch)`` returns the state tuple,
``forward_stream(units, f0_hz, speaker, noise, *state)`` returns
``(audio, *new_state)``; the same graph exports to ONNX with the state as
explicit inputs and outputs (``rtanon.train.export``). ``forward`` is the offline
call: ``forward_stream`` on the whole utterance from the zero state, so the
output of any chunking equals it up to float rounding. Every layer is causal
and the model has no lookahead: its algorithmic latency is 0 beyond the 20 ms
frame itself.

State layout: every stateful layer owns a *slot* ``(channels, length)``:
the last ``(kernel - 1) * dilation`` inputs of a causal convolution, the
``rate`` overlap-add tail of a transposed convolution, the source history
(160 samples) and the harmonic phase (one value: an integer below 2**24 in units of
2**-24 cycles, exact in float32). Slots with the same channel count are
concatenated along time into one tensor ``(B, channels, total_length)``; the
state tuple has one tensor per distinct channel count, in ascending channel
order (:attr:`HarmonicNoiseVocoder.state_shapes`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rtanon.constants import FRAME_SAMPLES, HOP_SAMPLES, SAMPLE_RATE_HZ
from rtanon.neural.config import VocoderConfig


#: Harmonic phase resolution: phases are integers modulo 2**PHASE_BITS (cycles * 2**PHASE_BITS).
PHASE_BITS = 24
_PHASE_ONE = 1 << PHASE_BITS


class _Slots:
    """Registry of state slots ``(channels, length)`` filled at construction."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def add(self, channels: int, length: int) -> int:
        self.shapes.append((channels, length))
        return len(self.shapes) - 1


def _wn(module: nn.Module, enabled: bool) -> nn.Module:
    return nn.utils.parametrizations.weight_norm(module) if enabled else module


class CausalConv1d(nn.Module):
    """Conv1d that sees only the past: its state is the last
    ``(kernel - 1) * dilation`` input samples."""

    def __init__(self, slots: _Slots, c_in: int, c_out: int, kernel: int, dilation: int = 1,
                 weight_norm: bool = True) -> None:
        super().__init__()
        self.context = (kernel - 1) * dilation
        self.conv = _wn(nn.Conv1d(c_in, c_out, kernel, dilation=dilation), weight_norm)
        self.slot = slots.add(c_in, self.context) if self.context else -1

    def forward(self, x: torch.Tensor, state: list[torch.Tensor], new: list[torch.Tensor | None]) -> torch.Tensor:
        if self.slot < 0:
            return self.conv(x)
        xx = torch.cat((state[self.slot], x), dim=2)
        new[self.slot] = xx[:, :, -self.context:]
        return self.conv(xx)


class CausalUpsample(nn.Module):
    """Transposed convolution (kernel ``2 * rate``, stride ``rate``) made
    causal by overlap-add: the last ``rate`` outputs of a call are partial
    sums carried to the next call."""

    def __init__(self, slots: _Slots, c_in: int, c_out: int, rate: int, weight_norm: bool = True) -> None:
        super().__init__()
        self.rate = rate
        self.conv = _wn(nn.ConvTranspose1d(c_in, c_out, 2 * rate, stride=rate, bias=False), weight_norm)
        self.bias = nn.Parameter(torch.zeros(c_out))
        self.slot = slots.add(c_out, rate)

    def forward(self, x: torch.Tensor, state: list[torch.Tensor], new: list[torch.Tensor | None]) -> torch.Tensor:
        r = self.rate
        y = self.conv(x)  # (B, C, (L + 1) * r)
        y = torch.cat((y[:, :, :r] + state[self.slot], y[:, :, r:]), dim=2)
        new[self.slot] = y[:, :, -r:]
        return y[:, :, :-r] + self.bias[None, :, None]


class ResBlock(nn.Module):
    """HiFi-GAN residual block, causal. Type 1 (V1/V2), per dilation d:
    ``x += conv_k(lrelu(conv_{k,d}(lrelu(x))))``; type 2 (V3): ``x += conv_{k,d}(lrelu(x))``."""

    def __init__(self, slots: _Slots, channels: int, kernel: int, dilations: tuple[int, ...],
                 weight_norm: bool = True, block_type: int = 1) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(CausalConv1d(slots, channels, channels, kernel, d, weight_norm) for d in dilations)
        n2 = len(dilations) if block_type == 1 else 0
        self.convs2 = nn.ModuleList(CausalConv1d(slots, channels, channels, kernel, 1, weight_norm) for _ in range(n2))

    def forward(self, x: torch.Tensor, state: list[torch.Tensor], new: list[torch.Tensor | None]) -> torch.Tensor:
        for k, c1 in enumerate(self.convs1):
            xt = c1(F.leaky_relu(x, 0.1), state, new)
            if len(self.convs2):
                xt = self.convs2[k](F.leaky_relu(xt, 0.1), state, new)
            x = x + xt
        return x


def _running_phase(f0: torch.Tensor, phase_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact integer phase of every sample: ``f0`` (B, F) Hz at 100 Hz (>= 0), ``phase_state`` (B, 1, 1)
    -> phases (B, F, 160) int64 in units of 2**-24 cycles, and the new state (B, 1, 1) float32.

    The per-sample increment ``round(f0 / 16000 * 2**24)`` is constant over a 10 ms frame, so any
    chunking gives bit-identical phases; the carried phase is an integer below 2**24, exact in float32."""
    b = f0.shape[0]
    inc = torch.round(f0 * (_PHASE_ONE / SAMPLE_RATE_HZ)).to(torch.int64)  # (B, F) per sample
    adv = inc * HOP_SAMPLES  # phase advance over one F0 frame
    phase0 = phase_state.reshape(b, 1).to(torch.int64)
    cum = torch.cumsum(adv, dim=1)
    start = torch.remainder(phase0 + cum - adv, _PHASE_ONE)  # (B, F) phase at each frame start
    new = torch.remainder(phase0 + cum[:, -1:], _PHASE_ONE).to(f0.dtype).reshape(b, 1, 1)
    j = torch.arange(HOP_SAMPLES, dtype=torch.int64, device=f0.device)
    return torch.remainder(start[:, :, None] + inc[:, :, None] * j, _PHASE_ONE), new


def _hz_to_mel(f):
    """HTK mel scale of a tensor or a float (Hz)."""
    if isinstance(f, torch.Tensor):
        return 2595.0 * torch.log10(1.0 + f / 700.0)
    return 2595.0 * math.log10(1.0 + f / 700.0)


class EnvelopeSynth(nn.Module):
    """Harmonic-plus-noise synthesis from two log-amplitude spectral envelopes per 10 ms F0 frame (the
    DDSP / neural-homomorphic idea: the network predicts the spectrum, signal processing makes the
    waveform, so the pitch is exactly the given F0 and the formants stay where the envelope puts them).

    Envelopes are ``(B, M, F)`` natural-log amplitudes at ``M`` points equally spaced on the mel scale from
    0 to 8 kHz, frame ``k`` for samples ``[160 k, 160 k + 160)``; between points they are interpolated
    linearly (in mel).

    - Harmonics ``h = 1..H`` of the F0 (voiced frames, below 7.8 kHz), each with amplitude
      ``exp(env_harm(h f0))``; the amplitudes move linearly over each frame from the previous frame's
      values (carried in the state), and the phase is exact integer arithmetic (:func:`_running_phase`).
    - Noise: the white ``noise`` input through a per-frame FIR of ``T`` taps whose magnitude response is
      ``exp(env_noise)`` (zero phase, delayed by ``T/2`` samples, Hann-windowed), crossfaded linearly from
      the previous frame's filter. The filter is a fixed cosine matrix applied to the magnitudes, so the
      graph has no FFT.

    State slots: the phase (1), the last frame's harmonic amplitudes (H), its noise FIR (T) and the last
    ``T - 1`` noise samples.
    """

    def __init__(self, slots: _Slots, config: VocoderConfig) -> None:
        super().__init__()
        m, h, t = config.envelope_points, config.envelope_harmonics, config.noise_taps
        self.num_harmonics, self.taps = h, t
        nyq = SAMPLE_RATE_HZ / 2
        points = torch.linspace(0.0, _hz_to_mel(nyq), m, dtype=torch.float64)
        self.register_buffer("mel_points", points.float(), persistent=False)
        self.mel_step = float(points[1] - points[0])
        # noise FIR: magnitudes at the T/2 + 1 bins of a T-point DFT, interpolated from the envelope points
        bins = torch.arange(t // 2 + 1, dtype=torch.float64) * (SAMPLE_RATE_HZ / t)
        w = torch.clamp(1.0 - (_hz_to_mel(bins)[:, None] - points[None, :]).abs() / self.mel_step, min=0.0)
        self.register_buffer("bin_interp", w.float(), persistent=False)  # (T/2+1, M)
        n = torch.arange(t, dtype=torch.float64) - t // 2
        b = torch.arange(t // 2 + 1, dtype=torch.float64)
        weight = torch.full((t // 2 + 1,), 2.0, dtype=torch.float64)
        weight[0] = weight[-1] = 1.0
        hann = torch.hann_window(t, periodic=False, dtype=torch.float64)
        cos = weight[:, None] * torch.cos(2.0 * math.pi * b[:, None] * n[None, :] / t) / t * hann[None, :]
        self.register_buffer("fir_basis", cos.float(), persistent=False)  # (T/2+1, T)
        j = torch.arange(HOP_SAMPLES, dtype=torch.int64)
        self.register_buffer("tap_index", j[:, None] + torch.arange(t, dtype=torch.int64)[None, :],
                             persistent=False)  # (160, T)
        self.register_buffer("ramp", (j.float() + 1.0) / HOP_SAMPLES, persistent=False)
        self.phase_slot = slots.add(1, 1)
        self.amp_slot = slots.add(h, 1)
        self.fir_slot = slots.add(t, 1)
        self.noise_slot = slots.add(1, t - 1)

    def forward(self, f0_hz: torch.Tensor, env_harm: torch.Tensor, env_noise: torch.Tensor, noise: torch.Tensor,
                state: list[torch.Tensor], new: list[torch.Tensor | None]) -> torch.Tensor:
        """``f0_hz`` (B, F) at 100 Hz, envelopes (B, M, F), ``noise`` (B, 160 F) -> speech (B, 1, 160 F)."""
        b, n_frames = f0_hz.shape
        f0 = torch.clamp(f0_hz, min=0.0)
        voiced = (f0 > 0.0).to(f0.dtype)
        p, new[self.phase_slot] = _running_phase(f0, state[self.phase_slot])  # (B, F, 160)
        h = torch.arange(1, self.num_harmonics + 1, dtype=torch.int64, device=f0.device)
        ph = torch.remainder(p[:, :, None, :] * h[None, None, :, None], _PHASE_ONE)  # (B, F, H, 160)
        sines = torch.sin(ph.to(f0.dtype) * (2.0 * math.pi / _PHASE_ONE))
        fh = f0[:, :, None] * h.to(f0.dtype)  # (B, F, H)
        w = torch.clamp(1.0 - (_hz_to_mel(fh)[..., None] - self.mel_points).abs() / self.mel_step, min=0.0)
        log_amp = torch.einsum("bfhm,bmf->bfh", w, env_harm)
        amp = torch.exp(torch.clamp(log_amp, max=4.0)) * (fh < 7800.0).to(f0.dtype) * voiced[:, :, None]
        prev = torch.cat((state[self.amp_slot].transpose(1, 2), amp[:, :-1]), dim=1)
        new[self.amp_slot] = amp[:, -1:].transpose(1, 2)
        s_cur = torch.einsum("bfh,bfhn->bfn", amp, sines)
        s_prev = torch.einsum("bfh,bfhn->bfn", prev, sines)
        harmonic = s_prev + (s_cur - s_prev) * self.ramp
        # noise through per-frame FIR filters, crossfaded
        mag = torch.exp(torch.clamp(torch.einsum("km,bmf->bfk", self.bin_interp, env_noise), max=4.0))
        fir = mag @ self.fir_basis  # (B, F, T)
        fir_prev = torch.cat((state[self.fir_slot].transpose(1, 2), fir[:, :-1]), dim=1)
        new[self.fir_slot] = fir[:, -1:].transpose(1, 2)
        x = torch.cat((state[self.noise_slot][:, 0], noise), dim=1)  # (B, T - 1 + 160 F)
        new[self.noise_slot] = x[:, None, -(self.taps - 1):]
        offsets = torch.arange(n_frames, dtype=torch.int64, device=f0.device) * HOP_SAMPLES
        frames = x[:, offsets[:, None, None] + self.tap_index]  # (B, F, 160, T)
        y_cur = torch.einsum("bfnt,bft->bfn", frames, fir)
        y_prev = torch.einsum("bfnt,bft->bfn", frames, fir_prev)
        noisy = y_prev + (y_cur - y_prev) * self.ramp
        return (harmonic + noisy).reshape(b, 1, n_frames * HOP_SAMPLES)


class HarmonicNoiseVocoder(nn.Module):
    """The generator. See the module docstring for shapes, rates and state."""

    def __init__(self, config: VocoderConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        wn = config.weight_norm
        slots = _Slots()
        chans = config.stage_channels()
        c0 = config.initial_channels
        self.conv_pre = CausalConv1d(slots, config.units_dim, c0, config.pre_kernel_size, 1, wn)
        self.spk_pre = nn.Linear(config.speaker_dim, c0)
        self.prenet = nn.ModuleList(CausalConv1d(slots, c0, c0, 3, d, wn) for d in config.prenet_dilations)
        m = config.envelope_points  # two 100 Hz frames of both envelopes per 50 Hz frame
        self.env_head = nn.Conv1d(c0, 4 * m, 1)
        with torch.no_grad():  # start quiet: harmonics about -40 dB, noise about -50 dB
            self.env_head.weight.mul_(0.1)
            self.env_head.bias.copy_(torch.tensor([-4.5] * m + [-5.5] * m).repeat(2))
        self.source = EnvelopeSynth(slots, config)
        self.ups = nn.ModuleList()
        self.spk_film = nn.ModuleList()
        self.source_convs = nn.ModuleList()
        self.mrfs = nn.ModuleList()
        self.source_strides: list[int] = []
        c_in = c0
        for i, (rate, c) in enumerate(zip(config.upsample_rates, chans)):
            self.ups.append(CausalUpsample(slots, c_in, c, rate, wn))
            self.spk_film.append(nn.Linear(config.speaker_dim, 2 * c))
            stride = math.prod(config.upsample_rates[i + 1:])
            self.source_strides.append(stride)
            self.source_convs.append(nn.Conv1d(1, c, 2 * stride, stride=stride) if stride > 1 else nn.Conv1d(1, c, 1))
            self.mrfs.append(nn.ModuleList(ResBlock(slots, c, k, d, wn, config.resblock_type)
                                           for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilations)))
            c_in = c
        self.source_history = max(self.source_strides)
        self.source_slot = slots.add(1, self.source_history)
        self.f0_conv = CausalConv1d(slots, 2, chans[0], config.f0_kernel_size, 1, wn)
        self.conv_post = CausalConv1d(slots, chans[-1], 1, config.post_kernel_size, 1, wn)
        with torch.no_grad():  # the stack's residual starts at zero: the synthesised speech alone
            inner = self.conv_post.conv
            if nn.utils.parametrize.is_parametrized(inner, "weight"):
                inner.parametrizations.weight.original0.zero_()
            else:
                inner.weight.zero_()
            inner.bias.zero_()
        self._slot_shapes = list(slots.shapes)
        self._groups = sorted({c for c, _ in self._slot_shapes})
        self._group_slots = [[i for i, (c, _) in enumerate(self._slot_shapes) if c == g] for g in self._groups]

    # ---- state -------------------------------------------------------------------------------
    @property
    def state_shapes(self) -> list[tuple[int, int]]:
        """``(channels, length)`` of each state tensor (batch dimension excluded), in order."""
        return [(g, sum(self._slot_shapes[i][1] for i in idx)) for g, idx in zip(self._groups, self._group_slots)]

    def init_state(self, batch: int, device: torch.device | str | None = None,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
        """Zero state for ``batch`` sessions: one ``(batch, C, L)`` tensor per entry of ``state_shapes``."""
        return tuple(torch.zeros(batch, c, n, device=device, dtype=dtype) for c, n in self.state_shapes)

    def _unpack(self, state: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = [None] * len(self._slot_shapes)  # type: ignore[list-item]
        for t, idx in zip(state, self._group_slots):
            parts = torch.split(t, [self._slot_shapes[i][1] for i in idx], dim=2)
            for i, part in zip(idx, parts):
                out[i] = part
        return out

    def _pack(self, slots: list[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
        return tuple(torch.cat([slots[i] for i in idx], dim=2) if len(idx) > 1 else slots[idx[0]]
                     for idx in self._group_slots)

    # ---- calls -------------------------------------------------------------------------------
    def _check(self, units: torch.Tensor, f0_hz: torch.Tensor, speaker: torch.Tensor, noise: torch.Tensor,
               state: tuple[torch.Tensor, ...]) -> None:
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return
        cfg = self.config
        if units.ndim != 3 or units.shape[2] != cfg.units_dim:
            raise ValueError(f"units must be (B, L, {cfg.units_dim}) at 50 Hz, got {tuple(units.shape)}")
        b, n = units.shape[:2]
        want = {"f0_hz": (f0_hz, (b, 2 * n)), "speaker": (speaker, (b, cfg.speaker_dim)),
                "noise": (noise, (b, FRAME_SAMPLES * n))}
        for name, (t, shape) in want.items():
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {shape} for {n} frames of 20 ms (F0 at 100 Hz, noise at 16 kHz), "
                                 f"got {tuple(t.shape)}")
        shapes = [(b, c, m) for c, m in self.state_shapes]
        if len(state) != len(shapes) or any(tuple(s.shape) != sh for s, sh in zip(state, shapes)):
            raise ValueError(f"state must be {len(shapes)} tensors of shapes {shapes} (use init_state({b})), "
                             f"got {[tuple(s.shape) for s in state]}")

    def forward_stream(self, units: torch.Tensor, f0_hz: torch.Tensor, speaker: torch.Tensor, noise: torch.Tensor,
                       *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One streaming step over ``L >= 1`` frames: ``(audio (B, 320 L), *new_state)``."""
        audio, new_state = self._step(units, f0_hz, speaker, noise, state)
        return (audio, *new_state)

    def _step(self, units: torch.Tensor, f0_hz: torch.Tensor, speaker: torch.Tensor, noise: torch.Tensor,
              state: tuple[torch.Tensor, ...], residual: bool = True):
        self._check(units, f0_hz, speaker, noise, state)
        cur = self._unpack(state)
        new: list[torch.Tensor | None] = [None] * len(cur)
        b = units.shape[0]
        units = 4.0 * units / torch.sqrt((units * units).sum(-1, keepdim=True) + 1e-8)
        x = self.conv_pre(units.transpose(1, 2), cur, new) + self.spk_pre(speaker)[:, :, None]
        for conv in self.prenet:
            x = x + conv(F.leaky_relu(x, 0.1), cur, new)
        e = self.env_head(F.leaky_relu(x, 0.1))  # (B, 4 M, L) -> (B, 2 M, 2 L)
        e = e.reshape(b, 2, -1, e.shape[2]).permute(0, 2, 3, 1).reshape(b, -1, 2 * e.shape[2])
        m = self.config.envelope_points
        src = self.source(f0_hz, e[:, :m], e[:, m:], noise, cur, new)
        if not residual:
            return torch.tanh(src)[:, 0, :], None
        hist = torch.cat((cur[self.source_slot], src), dim=2)
        new[self.source_slot] = hist[:, :, -self.source_history:]
        f0 = torch.clamp(f0_hz, min=0.0)
        voiced = (f0 > 0.0).to(f0.dtype)
        lf0 = (torch.log(torch.clamp(f0, min=1.0)) - self.config.log_f0_mean) / self.config.log_f0_std * voiced
        f0_cond = torch.stack((lf0, voiced), dim=1)  # (B, 2, 2L) at 100 Hz
        n_res = len(self.config.resblock_kernel_sizes)
        for i, (up, film, sconv, mrf) in enumerate(zip(self.ups, self.spk_film, self.source_convs, self.mrfs)):
            x = up(F.leaky_relu(x, 0.1), cur, new)
            gamma, beta = film(speaker).reshape(b, 2, -1, 1).unbind(1)
            x = x * (1.0 + gamma) + beta
            stride = self.source_strides[i]
            s_in = hist[:, :, self.source_history - stride:] if stride > 1 else src
            x = x + sconv(s_in)
            if i == 0:
                x = x + self.f0_conv(f0_cond, cur, new)
            xs = mrf[0](x, cur, new)
            for block in mrf[1:]:
                xs = xs + block(x, cur, new)
            x = xs / n_res
        x = self.conv_post(F.leaky_relu(x, 0.01), cur, new) + src
        audio = torch.tanh(x)[:, 0, :]
        return audio, self._pack(new)

    def forward(self, units: torch.Tensor, f0_hz: torch.Tensor, speaker: torch.Tensor,
                noise: torch.Tensor | None = None, residual: bool = True) -> torch.Tensor:
        """Offline: ``units`` (B, T, D), ``f0_hz`` (B, 2T), ``speaker`` (B, S), ``noise`` (B, 320 T) or
        None (drawn with ``torch.randn``) -> audio (B, 320 T) float32 at 16 kHz, from the zero state.
        ``residual=False``: the synthesised speech alone, without running the upsampling stack (the cheap
        first phase of training)."""
        if noise is None:
            noise = torch.randn(units.shape[0], FRAME_SAMPLES * units.shape[1], device=units.device,
                                dtype=units.dtype)
        state = self.init_state(units.shape[0], units.device, units.dtype)
        return self._step(units, f0_hz, speaker, noise, state, residual=residual)[0]

    # ---- inference helpers --------------------------------------------------------------------
    def folded(self) -> "HarmonicNoiseVocoder":
        """A new model in eval mode without weight norm (weights folded) for inference and export; this
        model is left as it is. (Removing parametrisations from a deep copy would break the original:
        the parametrised class is shared between copies.)"""
        from dataclasses import replace

        out = HarmonicNoiseVocoder(replace(self.config, weight_norm=False))
        sd = {}
        for name, mod in self.named_modules():
            for pname, p in mod.named_parameters(recurse=False):
                sd[f"{name}.{pname}" if name else pname] = p.detach()
            if nn.utils.parametrize.is_parametrized(mod, "weight"):
                sd[f"{name}.weight"] = mod.weight.detach()
                if mod.bias is not None:
                    sd[f"{name}.bias"] = mod.bias.detach()
        out.load_state_dict({k: v for k, v in sd.items() if k in out.state_dict()}, strict=True)
        return out.to(next(self.parameters()).device).eval()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def load_generator(path: str | Path, device: str = "cpu") -> HarmonicNoiseVocoder:
    """A generator from a ``generator.pt`` checkpoint (weights, config, step), in eval mode."""
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = HarmonicNoiseVocoder(VocoderConfig.from_dict(ckpt["config"])).to(device)
    model.load_state_dict(ckpt["generator"])
    return model.eval()


def state_names(model: HarmonicNoiseVocoder) -> list[str]:
    return [f"state_c{c}" for c, _ in model.state_shapes]
