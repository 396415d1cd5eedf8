"""Training losses of the vocoder (SSL-SAS paper 002, Eq. 2-5; HiFi-GAN; Parallel WaveGAN).

- :func:`discriminator_loss` (Eq. 3, least squares): ``sum_k E[(1 - D_k(x))^2] + E[D_k(G(s))^2]``.
- :func:`generator_adversarial_loss` (the adversarial part of Eq. 2): ``sum_k E[(1 - D_k(G(s)))^2]``.
- :func:`feature_matching_loss` (Eq. 4): ``sum_k sum_i mean|D_k^i(x) - D_k^i(G(s))|`` (the mean is the
  ``1 / N_i`` normalisation).
- :class:`MelLoss` (Eq. 5): L1 between log-mel spectrograms (80 bands, 1024-point FFT, 40 ms window,
  10 ms hop at 16 kHz).
- :class:`MultiResolutionStftLoss`: spectral convergence plus log-magnitude L1, averaged over three
  STFT resolutions.
- :func:`generator_loss` (Eq. 2): ``adv + lambda_fm * FM + lambda_mel * Mel (+ lambda_stft * STFT)``,
  with ``lambda_fm = 2``, ``lambda_mel = 45`` as in the paper.

Audio arguments are ``(B, T)`` or ``(B, 1, T)`` float32 at 16 kHz in [-1, 1].
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rtanon.constants import SAMPLE_RATE_HZ

LAMBDA_FM = 2.0
LAMBDA_MEL = 45.0


def _flat(audio: torch.Tensor) -> torch.Tensor:
    return audio.reshape(audio.shape[0], -1)


def slaney_mel_filterbank(sample_rate_hz: int, n_fft: int, n_mels: int, fmin_hz: float = 0.0,
                          fmax_hz: float | None = None) -> np.ndarray:
    """Slaney-scale, area-normalised triangular mel filters ``(n_mels, n_fft // 2 + 1)`` float32
    (the librosa default HiFi-GAN uses)."""
    fmax_hz = fmax_hz or sample_rate_hz / 2

    def hz_to_mel(f):
        f = np.asarray(f, np.float64)
        lin = f / (200.0 / 3)
        log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
        return np.where(f >= 1000.0, log, lin)

    def mel_to_hz(m):
        m = np.asarray(m, np.float64)
        lin = m * (200.0 / 3)
        log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
        return np.where(m >= 15.0, log, lin)

    freqs = np.linspace(0, sample_rate_hz / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin_hz), hz_to_mel(fmax_hz), n_mels + 2))
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    fb = np.maximum(0.0, np.minimum(lower, upper))
    fb *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return fb.astype(np.float32)


class MelSpectrogram(nn.Module):
    """Log-mel spectrogram: ``(B, T)`` audio -> ``(B, n_mels, frames)`` natural-log magnitudes."""

    def __init__(self, n_fft: int = 1024, hop: int = 160, win: int = 640, n_mels: int = 80,
                 fmin_hz: float = 0.0, fmax_hz: float | None = None) -> None:
        super().__init__()
        self.n_fft, self.hop, self.win = n_fft, hop, win
        self.register_buffer("window", torch.hann_window(win), persistent=False)
        fb = slaney_mel_filterbank(SAMPLE_RATE_HZ, n_fft, n_mels, fmin_hz, fmax_hz)
        self.register_buffer("mel_basis", torch.from_numpy(fb), persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(_flat(audio).float(), self.n_fft, self.hop, self.win, self.window, center=True,
                          return_complex=True)
        mag = torch.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
        return torch.log(torch.clamp(self.mel_basis @ mag, min=1e-5))


class MelLoss(nn.Module):
    """Eq. 5: mean L1 between log-mel spectrograms of the reference and the generated audio."""

    def __init__(self, **mel_kwargs) -> None:
        super().__init__()
        self.mel = MelSpectrogram(**mel_kwargs)

    def forward(self, generated: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        return F.l1_loss(self.mel(generated), self.mel(reference))


class MultiResolutionStftLoss(nn.Module):
    """Spectral convergence ``||S_r - S_g||_F / ||S_r||_F`` plus ``mean|log S_r - log S_g|``, averaged
    over ``resolutions`` of (n_fft, hop, win)."""

    def __init__(self, resolutions: tuple[tuple[int, int, int], ...] = ((512, 50, 240), (1024, 120, 600),
                                                                        (2048, 240, 1200))) -> None:
        super().__init__()
        self.resolutions = resolutions
        for i, (_, _, win) in enumerate(resolutions):
            self.register_buffer(f"window{i}", torch.hann_window(win), persistent=False)

    def forward(self, generated: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        g, r = _flat(generated).float(), _flat(reference).float()
        total = g.new_zeros(())
        for i, (n_fft, hop, win) in enumerate(self.resolutions):
            w = getattr(self, f"window{i}")
            sg = torch.stft(g, n_fft, hop, win, w, return_complex=True).abs().clamp(min=1e-7)
            sr = torch.stft(r, n_fft, hop, win, w, return_complex=True).abs().clamp(min=1e-7)
            sc = torch.linalg.norm(sr - sg, dim=(1, 2)) / torch.linalg.norm(sr, dim=(1, 2)).clamp(min=1e-7)
            total = total + sc.mean() + F.l1_loss(torch.log(sg), torch.log(sr))
        return total / len(self.resolutions)


def discriminator_loss(real_scores: list[torch.Tensor], fake_scores: list[torch.Tensor]) -> torch.Tensor:
    """Eq. 3 (least-squares GAN): real scores pushed to 1, generated ones to 0."""
    return sum(torch.mean((1.0 - r) ** 2) + torch.mean(f ** 2) for r, f in zip(real_scores, fake_scores))


def generator_adversarial_loss(fake_scores: list[torch.Tensor]) -> torch.Tensor:
    """Adversarial part of Eq. 2: generated scores pushed to 1."""
    return sum(torch.mean((1.0 - f) ** 2) for f in fake_scores)


def feature_matching_loss(real_fmaps: list[list[torch.Tensor]], fake_fmaps: list[list[torch.Tensor]]) -> torch.Tensor:
    """Eq. 4: L1 between discriminator feature maps of real and generated audio, each layer's mean
    (the 1/N_i), summed over layers and sub-discriminators. Real maps are detached."""
    return sum(torch.mean(torch.abs(r.detach() - f)) for rs, fs in zip(real_fmaps, fake_fmaps) for r, f in zip(rs, fs))


def generator_loss(mel_loss: torch.Tensor, fake_scores: list[torch.Tensor] | None = None,
                   real_fmaps: list[list[torch.Tensor]] | None = None,
                   fake_fmaps: list[list[torch.Tensor]] | None = None, stft_loss: torch.Tensor | None = None,
                   lambda_fm: float = LAMBDA_FM, lambda_mel: float = LAMBDA_MEL,
                   lambda_stft: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 2, plus an optional multi-resolution STFT term. Without discriminator outputs (the warm-up
    phase, or when compute does not allow a GAN) only the spectral terms count. Returns the total and
    its parts as floats for logging."""
    total = lambda_mel * mel_loss
    parts = {"mel": float(mel_loss.detach())}
    if stft_loss is not None:
        total = total + lambda_stft * stft_loss
        parts["stft"] = float(stft_loss.detach())
    if fake_scores is not None:
        adv = generator_adversarial_loss(fake_scores)
        total = total + adv
        parts["adv"] = float(adv.detach())
    if real_fmaps is not None and fake_fmaps is not None:
        fm = feature_matching_loss(real_fmaps, fake_fmaps)
        total = total + lambda_fm * fm
        parts["fm"] = float(fm.detach())
    parts["total"] = float(total.detach())
    return total, parts
