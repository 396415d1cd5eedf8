"""Feature extraction into vocoder training shards, with pluggable extractors.

``build_shards(data_dirs, out_dir, extractors, units_dim)`` reads Kaldi-style
directories (``so762_train``, ``libri_clips``), optionally perturbs each
utterance (``augmentations``, e.g. :func:`speed_perturbation`), runs the
extractors and writes :mod:`rtanon.neural.train` shards. The extractors are
callables so the content encoder, the F0 tracker and the speaker encoder can
be plugged in when they exist:

- ``units(audio) -> (T, K)`` float32 at 50 Hz: frame ``t`` describes samples
  ``[320 t, 320 t + 320)`` (the extractor owns that alignment);
- ``f0_hz(audio) -> (2T',)`` float32 at 100 Hz, 0 = unvoiced;
- ``speaker_embedding([audio, ...]) -> (D,)`` float32 from all utterances of
  one (possibly perturbed) speaker;
- ``speaker_by_id(speaker_id) -> (D,) or None`` (optional): a precomputed
  embedding of an unperturbed speaker (the shipped speaker pool holds every
  training speaker's), used instead of ``speaker_embedding`` when it answers.

:func:`default_extractors` plugs in rtanon's own models: the shipped content
encoder (offline, from the zero state, as a fresh stream sees it), the F0
tracker (``track``: frame ``j`` centred at ``160 j``) and the speaker pool /
resemblyzer.

``audio`` is always ``(N,)`` float32 at 16 kHz in [-1, 1]. The three streams
are trimmed to the shortest common number of 20 ms frames. A perturbed copy
of a speaker is a new training speaker (Kaldi's speed-perturbation
convention: ``sp0.9-<spk>``), with its own embedding, and its F0 and units are
extracted from the perturbed audio, so they stay aligned.

Development evaluation data must never be trained on: a directory whose name
contains ``dev`` or ``test`` is refused unless ``allow_eval_dirs`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ
from rtanon.neural.rates import HOP_SAMPLES
from rtanon.neural.train import ShardWriter


@dataclass(frozen=True)
class Extractors:
    units: Callable[[np.ndarray], np.ndarray]
    f0_hz: Callable[[np.ndarray], np.ndarray]
    speaker_embedding: Callable[[list[np.ndarray]], np.ndarray]
    speaker_by_id: Callable[[str], np.ndarray | None] | None = None
    #: width of what ``units`` returns, when the extractor knows it (``default_extractors`` does)
    units_dim: int | None = None
    #: sha256 of the content encoder's graph (recorded in the shards' manifest, then in the vocoder's config)
    content_sha256: str = ""


def default_extractors(f0_kernel: str = "auto", units_kind: str = "probs",
                       content_onnx: str | Path | None = None) -> Extractors:
    """rtanon's content encoder (the packaged one, or the graph ``content_onnx``), F0 tracker and speaker
    embeddings (pool first, resemblyzer otherwise). ``units_kind``: the content encoder's soft units
    ("probs", at its trained temperature) or its unit-space projections ("z")."""
    from rtanon.content.stream import ContentEncoderModel, ContentStreamConfig
    from rtanon.f0.tracker import track
    from rtanon.identity.pool import SpeakerPool, _unit

    content = ContentEncoderModel(content_onnx, ContentStreamConfig(output=units_kind))
    pool = SpeakerPool.load_default()
    row = {str(s): i for i, s in enumerate(pool.speaker_ids)}
    encoder = None

    def speaker_embedding(audios: list[np.ndarray]) -> np.ndarray:
        nonlocal encoder
        if encoder is None:
            from rtanon.identity.encoder import make_encoder

            encoder = make_encoder("resemblyzer")
        return _unit(np.mean([encoder.embed(a) for a in audios], axis=0))

    def by_id(spk: str) -> np.ndarray | None:
        return pool.embeddings[row[spk]] if spk in row else None

    return Extractors(units=content.encode, f0_hz=lambda a: track(a, kernel=f0_kernel),
                      speaker_embedding=speaker_embedding, speaker_by_id=by_id, units_dim=content.output_dim,
                      content_sha256=content.sha256)


@dataclass(frozen=True)
class Augmentation:
    """``name`` prefixes the speaker and utterance ids of the copies (``sp0.9-spk``)."""

    name: str
    apply: Callable[[np.ndarray], np.ndarray]


def speed_perturbation(factor: float) -> Augmentation:
    """Plays the audio ``factor`` times faster (resampling): pitch and formants scale by ``factor`` and
    the duration by ``1 / factor``, as Kaldi's speed perturbation does."""
    if not 0.5 <= factor <= 2.0:
        raise ValueError(f"speed factor {factor}; use 0.5 to 2.0 (0.9 and 1.1 are usual)")

    def apply(audio: np.ndarray) -> np.ndarray:
        import soxr

        return soxr.resample(audio, SAMPLE_RATE_HZ, SAMPLE_RATE_HZ / factor).astype(np.float32)

    return Augmentation(f"sp{factor:g}", apply)


def _aligned(units: np.ndarray, f0: np.ndarray, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = min(units.shape[0], f0.shape[0] // 2, audio.shape[0] // HOP_SAMPLES)
    return units[:t], f0[:2 * t], audio[:HOP_SAMPLES * t]


def build_shards(data_dirs: list[str | Path], out_dir: str | Path, extractors: Extractors, units_dim: int, *,
                 augmentations: tuple[Augmentation, ...] = (), max_shard_mib: float = 16.0,
                 speakers: set[str] | None = None, min_frames: int = 10, allow_eval_dirs: bool = False,
                 progress: bool = True, units_kind: str = "probs") -> Path:
    """Writes shards for every utterance (of ``speakers`` only, when given) of ``data_dirs``, plus one
    perturbed copy per augmentation; returns the manifest path. Speakers are processed one at a time
    (their utterances in memory together, for the embedding). ``units_kind`` is recorded in the manifest
    ("probs" or "z": what ``extractors.units`` returns)."""
    from tqdm import tqdm

    from rtanon.audio_io import read_audio
    from rtanon.kaldi import KaldiDir

    dirs = [KaldiDir.load(d) for d in data_dirs]
    for d in dirs:
        name = d.root.resolve().name.lower()
        if not allow_eval_dirs and ("dev" in name or "test" in name):
            raise ValueError(f"{d.root} looks like evaluation data; never train on it (so762_dev is for "
                             "evaluation only). Pass allow_eval_dirs=True only for a deliberate exception.")
    writer = ShardWriter(out_dir, units_dim, max_shard_mib, units_kind=units_kind,
                         content_sha256=extractors.content_sha256)
    speaker_ids: list[str] = []
    embeddings: list[np.ndarray] = []
    jobs = []
    for d in dirs:
        by_spk: dict[str, list[str]] = {}
        for utt in sorted(d.wav):
            spk = d.utt2spk[utt]
            if speakers is None or spk in speakers:
                by_spk.setdefault(spk, []).append(utt)
        jobs += [(d, spk, utts) for spk, utts in sorted(by_spk.items())]
    for d, spk, utts in tqdm(jobs, desc="features", unit="spk", disable=not progress):
        originals = {u: read_audio(d.wav[u]) for u in utts}
        for aug in (None, *augmentations):
            prefix = f"{aug.name}-" if aug else ""
            audios = {u: (aug.apply(a) if aug else a) for u, a in originals.items()}
            kept = []
            for utt, audio in audios.items():
                units, f0, audio_t = _aligned(np.asarray(extractors.units(audio), np.float32),
                                              np.asarray(extractors.f0_hz(audio), np.float32), audio)
                if units.shape[0] < min_frames:
                    continue
                kept.append((utt, units, f0, audio_t))
            if not kept:
                continue
            emb = extractors.speaker_by_id(spk) if (aug is None and extractors.speaker_by_id) else None
            if emb is None:
                emb = extractors.speaker_embedding([audios[u] for u, *_ in kept])
            emb = np.asarray(emb, np.float32)
            index = len(speaker_ids)
            speaker_ids.append(prefix + spk)
            embeddings.append(emb)
            for utt, units, f0, audio_t in kept:
                writer.add(prefix + utt, index, units, f0, audio_t)
    if not speaker_ids:
        raise ValueError("no utterance long enough was found; check data_dirs and speakers")
    return writer.close(speaker_ids, np.stack(embeddings))
