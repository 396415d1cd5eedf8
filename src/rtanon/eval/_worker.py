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
        elif kind == "phones":
            from rtanon.eval.asr import PhoneRecognizer
            _MODELS[key] = PhoneRecognizer()
        elif kind == "f0":
            from rtanon.eval.pitch import F0Tracker
            _MODELS[key] = F0Tracker(**kw)
        else:
            raise KeyError(kind)
    return _MODELS[key]


def anonymize_shard(anonymizer_config, subset, out: str, assignment: str, seed: int) -> tuple[int, dict]:
    """Anonymizes one shard (a KaldiDir of whole speakers) with
    :func:`rtanon.corpus.run.anonymize_dir`. Returns the number of utterances and
    the CPU seconds spent, ``{"anonymize": s}``."""
    from rtanon.corpus.run import anonymize_dir
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
    ``embedding`` ((256,) float32), ``text:MODEL`` (str, Whisper ``MODEL``'s transcript), ``phones``
    (str, the recognised phones separated by spaces), ``f0`` ((frames,) float64) and ``words``: word
    timings [(start_s, end_s, word), ...] by Whisper tiny.en's forced alignment of ``align_text`` (the
    reference transcript; None: its own transcript of the file); empty for audio longer than one Whisper
    window. Returns the results and the CPU seconds per analysis (model loading included)."""
    from rtanon.io.audio import read_audio
    from rtanon.config import SAMPLE_RATE_HZ

    cpu = {}
    t = time.process_time()
    x = read_audio(path)
    cpu["read"] = time.process_time() - t
    out = {}
    order = ["embedding"] + sorted(w for w in wants if w.startswith("text:")) + ["phones", "words", "f0"]
    for kind in order:
        if kind not in wants:
            continue
        t = time.process_time()
        if kind == "embedding":
            out[kind] = _model("embedder", threads=threads).embed(x)
        elif kind.startswith("text:"):
            asr = _model("asr", model=kind[5:], beam_size=asr_beam_size, threads=threads)
            out[kind] = asr.transcribe(x)
        elif kind == "phones":
            out[kind] = " ".join(_model("phones").phones(x))
        elif kind == "words":
            asr = _model("asr", model="tiny.en", beam_size=asr_beam_size, threads=threads)
            if x.shape[0] > asr.WINDOW_S * SAMPLE_RATE_HZ:
                out[kind] = []
            else:
                text = align_text if align_text is not None else out.get("text:tiny.en") or asr.transcribe(x)
                out[kind] = asr.align(x, text)
        else:
            out[kind] = _model("f0").track(x)
        cpu[kind] = time.process_time() - t
    return out, cpu


def embed_slices(path: str, bounds: tuple, threads: int) -> tuple[np.ndarray, dict]:
    """The attacker's embeddings of one file's slices, ``bounds`` =
    ((start_s, end_s), ...): (n, 256) float32, and the CPU seconds."""
    from rtanon.io.audio import read_audio
    from rtanon.eval.slicing import cut

    t = time.process_time()
    emb = _model("embedder", threads=threads)
    x = read_audio(path)
    out = np.stack([emb.embed(s) for s in cut(x, bounds)]).astype(np.float32)
    return out, {"slice_embedding": time.process_time() - t}


def analyzer_names(asr_beam_size: int, asr_models: tuple[str, ...] = ("tiny.en",)) -> dict:
    """Names of the analyzers (for cache tags and the report), without loading the big models: one
    ``text:MODEL`` per Whisper model (tiny.en's tag is the one caches of earlier versions hold)."""
    from rtanon.eval.attacker import bundled_embedder_path
    from rtanon.eval.pitch import F0Tracker

    emb = bundled_embedder_path()
    names = {"embedding": f"dvector:{emb.stat().st_size}",
             "words": "whisper-tiny.en-ct2-int8-forced-alignment",
             "phones": "hama-1.7.0-phone-ctc",
             "f0": F0Tracker().name}
    for m in asr_models:
        names[f"text:{m}"] = f"whisper-{m}-ct2-int8-beam{asr_beam_size}" + ("" if m == "tiny.en" else "-en")
    return names
