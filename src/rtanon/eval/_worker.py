"""Work units of an evaluation, run in worker processes (or in-process with
``jobs=1``). Models are built on first use and kept for the life of the
worker process in ``_MODELS`` (per-process state, created lazily, never at
import). Each unit also returns the CPU seconds it used, so a report can say
what a run costs independently of how busy the machine was."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

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


def anonymize_shard(anonymizer_config, subset, out: str, assignment: str, seed: int) -> tuple[int, dict]:
    """Anonymizes one shard (a KaldiDir of whole speakers) with
    :func:`rtanon.corpus.anonymize_dir`. Returns the number of utterances and
    the CPU seconds spent, ``{"anonymize": s}``."""
    from rtanon.corpus import anonymize_dir
    from rtanon.engine import Anonymizer

    t = time.process_time()
    key = ("anonymizer", repr(anonymizer_config))
    if key not in _MODELS:
        _MODELS[key] = Anonymizer(anonymizer_config)
    anonymize_dir(_MODELS[key], subset, Path(out), assignment=assignment, seed=seed, progress=False)
    return len(subset.wav), {"anonymize": time.process_time() - t}


def analyze(path: str, wants: tuple[str, ...], asr_beam_size: int, threads: int,
            align_text: str | None = None) -> tuple[dict, dict]:
    """Reads one audio file and computes what ``wants`` lists:
    ``embedding`` ((256,) float32), ``text`` (str), ``f0`` ((frames,) float64)
    and ``words``: word timings [(start_s, end_s, word), ...] by forced
    alignment of ``align_text`` (the reference transcript; None: Whisper's own
    transcript of the file); empty for audio longer than one Whisper window.
    Returns the results and the CPU seconds per analysis (model loading included)."""
    from rtanon.audio_io import read_audio
    from rtanon.config import SAMPLE_RATE_HZ

    cpu = {}
    t = time.process_time()
    x = read_audio(path)
    cpu["read"] = time.process_time() - t
    out = {}
    for kind in ("embedding", "text", "words", "f0"):
        if kind not in wants:
            continue
        t = time.process_time()
        if kind == "embedding":
            out[kind] = _model("embedder", threads=threads).embed(x)
        elif kind == "text":
            out[kind] = _model("asr", beam_size=asr_beam_size, threads=threads).transcribe(x)
        elif kind == "words":
            asr = _model("asr", beam_size=asr_beam_size, threads=threads)
            if x.shape[0] > asr.WINDOW_S * SAMPLE_RATE_HZ:
                out[kind] = []
            else:
                text = align_text if align_text is not None else out.get("text") or asr.transcribe(x)
                out[kind] = asr.align(x, text)
        else:
            out[kind] = _model("f0").track(x)
        cpu[kind] = time.process_time() - t
    return out, cpu


def embed_slices(path: str, bounds: tuple, threads: int) -> tuple[np.ndarray, dict]:
    """The attacker's embeddings of one file's slices, ``bounds`` =
    ((start_s, end_s), ...): (n, 256) float32, and the CPU seconds."""
    from rtanon.audio_io import read_audio
    from rtanon.eval.slicing import cut

    t = time.process_time()
    emb = _model("embedder", threads=threads)
    x = read_audio(path)
    out = np.stack([emb.embed(s) for s in cut(x, bounds)]).astype(np.float32)
    return out, {"slice_embedding": time.process_time() - t}


def analyzer_names(asr_beam_size: int) -> dict:
    """Names of the analyzers (for cache tags and the report), without loading the big models."""
    from rtanon.eval.attacker import bundled_embedder_path
    from rtanon.eval.pitch import F0Tracker

    emb = bundled_embedder_path()
    return {"embedding": f"dvector:{emb.stat().st_size}",
            "text": f"whisper-tiny.en-ct2-int8-beam{asr_beam_size}",
            "words": "whisper-tiny.en-ct2-int8-forced-alignment",
            "f0": F0Tracker().name}
