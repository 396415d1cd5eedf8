"""Work units of an evaluation, run in worker processes (or in-process with
``jobs=1``). Models are built on first use and kept for the life of the
worker process in ``_MODELS`` (per-process state, created lazily, never at
import)."""

from __future__ import annotations

from pathlib import Path

_MODELS: dict = {}


def _model(kind: str, **kw):
    key = (kind, tuple(sorted(kw.items())))
    if key not in _MODELS:
        if kind == "embedder":
            from rtanon.eval.attacker import DVectorEmbedder
            _MODELS[key] = DVectorEmbedder(**kw)
        elif kind == "asr":
            from rtanon.eval.asr import WhisperTranscriber
            _MODELS[key] = WhisperTranscriber(**kw)
        elif kind == "f0":
            from rtanon.eval.pitch import F0Tracker
            _MODELS[key] = F0Tracker(**kw)
        else:
            raise KeyError(kind)
    return _MODELS[key]


def anonymize_shard(anonymizer_config, subset, out: str, assignment: str, seed: int) -> int:
    """Anonymizes one shard (a KaldiDir of whole speakers) with
    :func:`rtanon.corpus.anonymize_dir`; returns the number of utterances."""
    from rtanon.corpus import anonymize_dir
    from rtanon.engine import Anonymizer

    key = ("anonymizer", repr(anonymizer_config))
    if key not in _MODELS:
        _MODELS[key] = Anonymizer(anonymizer_config)
    anonymize_dir(_MODELS[key], subset, Path(out), assignment=assignment, seed=seed, progress=False)
    return len(subset.wav)


def analyze(path: str, wants: tuple[str, ...], asr_beam_size: int, threads: int) -> dict:
    """Reads one audio file and computes what ``wants`` lists:
    ``embedding`` ((256,) float32), ``text`` (str), ``f0`` ((frames,) float64)."""
    from rtanon.audio_io import read_audio

    x = read_audio(path)
    out = {}
    if "embedding" in wants:
        out["embedding"] = _model("embedder", threads=threads).embed(x)
    if "text" in wants:
        out["text"] = _model("asr", beam_size=asr_beam_size, threads=threads).transcribe(x)
    if "f0" in wants:
        out["f0"] = _model("f0").track(x)
    return out


def analyzer_names(asr_beam_size: int) -> dict:
    """Names of the analyzers (for cache tags and the report), without loading the big models."""
    from rtanon.eval.attacker import bundled_embedder_path
    from rtanon.eval.pitch import F0Tracker

    emb = bundled_embedder_path()
    return {"embedding": f"dvector:{emb.stat().st_size}",
            "text": f"whisper-tiny.en-ct2-int8-beam{asr_beam_size}",
            "f0": F0Tracker().name}
