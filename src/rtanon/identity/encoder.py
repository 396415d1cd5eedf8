"""Speaker encoders: 16 kHz speech in, one L2-normalised speaker embedding out.

``SpeakerEncoder`` is the interface (``name``, ``dim``, ``embed(audio)``);
``make_encoder("resemblyzer")`` is the factory and ``ResemblyzerEncoder`` the
default implementation (256-dim d-vector of Wan et al. GE2E, weights shipped
inside the ``resemblyzer`` PyPI package, Apache-2.0; nothing is downloaded).

``embed_first_speech(audio, encoder)`` embeds the first seconds of speech of
a session (the user's voice, kept in memory only, never written to disk).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.errors import install_hint

#: Install hint for the default encoder (resemblyzer pins old dependency ranges,
#: so it is installed without them and its real needs are listed explicitly).
RESEMBLYZER_HINT = (f"the speaker encoder needs resemblyzer: {install_hint('identity')} (it installs "
                    "resemblyzer==0.1.4 with --no-deps beside torch==2.13.0, librosa and webrtcvad-wheels)")


class SpeakerEncoder(Protocol):
    name: str
    dim: int

    def embed(self, audio: np.ndarray) -> np.ndarray:
        """(T,) float32 16 kHz mono speech in [-1, 1] -> (dim,) float32, unit L2 norm."""
        ...


class ResemblyzerEncoder:
    """Resemblyzer's GE2E d-vector (3-layer LSTM over 40 mels, 1.6 s partials,
    averaged and re-normalised). Runs on the CPU; about 100x real time on one core."""

    name = "resemblyzer-0.1.4"
    dim = 256

    def __init__(self, device: str = "cpu") -> None:
        try:
            from resemblyzer import VoiceEncoder
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(f"{exc}; {RESEMBLYZER_HINT}") from exc
        self._encoder = VoiceEncoder(device, verbose=False)

    def embed(self, audio: np.ndarray) -> np.ndarray:
        """(T,) float32 16 kHz mono in [-1, 1] (at least ~0.5 s) -> (256,) float32, unit norm.

        Resemblyzer's preprocessing normalises the loudness and removes long
        silences (webrtcvad); when that leaves under 0.5 s the untrimmed audio is used."""
        from resemblyzer import preprocess_wav

        audio = _check_audio(audio, "ResemblyzerEncoder.embed")
        wav = preprocess_wav(audio, source_sr=SAMPLE_RATE_HZ)
        if wav.shape[0] < SAMPLE_RATE_HZ // 2:
            wav = audio
        e = np.asarray(self._encoder.embed_utterance(wav), dtype=np.float32)
        return e / max(float(np.linalg.norm(e)), 1e-12)


#: Encoder name -> class; ``make_encoder`` is the only place that imports a backend.
ENCODERS = {"resemblyzer": ResemblyzerEncoder}


def make_encoder(name: str = "resemblyzer", **kwargs) -> SpeakerEncoder:
    if name not in ENCODERS:
        raise ValueError(f"unknown speaker encoder {name!r}; choose one of {sorted(ENCODERS)}")
    return ENCODERS[name](**kwargs)


def _check_audio(audio: np.ndarray, who: str) -> np.ndarray:
    audio = np.asarray(audio)
    if audio.ndim != 1 or audio.dtype != np.float32:
        raise ValueError(f"{who}: expected a 1-D float32 array at 16 kHz, got shape {audio.shape} "
                         f"dtype {audio.dtype}; convert with audio.astype(np.float32)")
    if audio.shape[0] < SAMPLE_RATE_HZ // 4:
        raise ValueError(f"{who}: {audio.shape[0]} samples is under 0.25 s; give at least 1 s of speech")
    return np.nan_to_num(audio)


def speech_frames(audio: np.ndarray, aggressiveness: int = 3, frame_ms: int = 30) -> np.ndarray:
    """Boolean speech mask per ``frame_ms`` frame of (T,) float32 16 kHz audio (webrtcvad)."""
    import webrtcvad

    vad = webrtcvad.Vad(aggressiveness)
    n = SAMPLE_RATE_HZ * frame_ms // 1000
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
    frames = pcm[: pcm.shape[0] // n * n].reshape(-1, n)
    return np.array([vad.is_speech(f.tobytes(), SAMPLE_RATE_HZ) for f in frames], dtype=bool)


def embed_first_speech(audio: np.ndarray, encoder: SpeakerEncoder, *, speech_seconds: float = 3.0,
                       frame_ms: int = 30) -> np.ndarray | None:
    """Embeds the first ``speech_seconds`` of speech found in the start of a session.

    ``audio``: (T,) float32 16 kHz mono in [-1, 1] (what the session heard so far).
    Returns the (dim,) unit-norm embedding, or ``None`` while fewer than
    ``speech_seconds`` of speech (webrtcvad, aggressiveness 3) have been heard,
    so the caller can keep listening. The result is the user's own voice: keep
    it in memory only and drop it once the pseudo-speaker is chosen.
    """
    audio = _check_audio(audio, "embed_first_speech")
    mask = speech_frames(audio, frame_ms=frame_ms)
    n = SAMPLE_RATE_HZ * frame_ms // 1000
    need = int(np.ceil(speech_seconds * 1000 / frame_ms))
    idx = np.flatnonzero(mask)
    if idx.shape[0] < need:
        return None
    speech = np.concatenate([audio[i * n:(i + 1) * n] for i in idx[:need]])
    return encoder.embed(speech)
