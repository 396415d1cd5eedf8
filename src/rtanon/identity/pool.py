"""The speaker pool: the real voices pseudo-speakers are made from.

``SpeakerPool`` holds, per speaker, the mean of its utterance embeddings
(re-normalised), gender, age (NaN when unknown), source corpus, the F0
quantiles in Hz of its voiced frames (levels 0..100 %) with the voiced-frame
count, and every utterance embedding (for PLDA training and utterance-level
work). ``SpeakerPool.load_default()`` reads the pool shipped as package data
(``rtanon/models/speaker_pool.npz``, see its model card);
``build_pool(dirs, encoder)`` makes a new one from Kaldi-style directories
(``rtanon pool build``).

File format: one ``.npz`` with arrays and a JSON string ``meta`` holding
``format_version`` (:data:`POOL_FORMAT_VERSION`), the encoder and F0 tracker
names, sources and creation time. Arrays: ``speaker_ids`` (S,) str,
``embeddings`` (S, D) float32, ``genders`` (S,) 'm'/'f', ``ages_years`` (S,)
float32, ``corpora`` (S,) str, ``f0_quantiles_hz`` (S, Q) float32,
``voiced_frames`` (S,) int32, ``utt_embeddings`` (U, D) float16,
``utt_speaker`` (U,) int32.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from rtanon.atomic import atomic_open
from rtanon.paths import check_regular
from rtanon.identity.pitch import QUANTILE_LEVELS

POOL_FORMAT_VERSION = 1
DEFAULT_POOL_FILE = "speaker_pool.npz"


class PoolError(Exception):
    """A pool file is missing, from an incompatible version, or malformed."""


def unit_norm(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@dataclass(frozen=True)
class SpeakerPool:
    speaker_ids: np.ndarray
    embeddings: np.ndarray
    genders: np.ndarray
    ages_years: np.ndarray
    corpora: np.ndarray
    f0_quantiles_hz: np.ndarray
    voiced_frames: np.ndarray
    utt_embeddings: np.ndarray
    utt_speaker: np.ndarray
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.speaker_ids.shape[0])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def quantile_levels(self) -> np.ndarray:
        return np.asarray(self.meta.get("quantile_levels", QUANTILE_LEVELS), dtype=np.float64)

    def gender_index(self, gender: str) -> np.ndarray:
        """Indices of the speakers of ``gender`` ('m' or 'f')."""
        if gender not in ("m", "f"):
            raise ValueError(f"gender={gender!r}; use 'm' or 'f'")
        return np.flatnonzero(self.genders == gender)

    def subset(self, index: np.ndarray) -> "SpeakerPool":
        """A pool with the speakers ``index`` (and only their utterances)."""
        index = np.asarray(index)
        remap = -np.ones(len(self), dtype=np.int64)
        remap[index] = np.arange(index.shape[0])
        keep = remap[self.utt_speaker] >= 0
        return SpeakerPool(self.speaker_ids[index], self.embeddings[index], self.genders[index],
                           self.ages_years[index], self.corpora[index], self.f0_quantiles_hz[index],
                           self.voiced_frames[index], self.utt_embeddings[keep],
                           remap[self.utt_speaker[keep]].astype(np.int32), dict(self.meta))

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(self.meta, format_version=POOL_FORMAT_VERSION)
        with atomic_open(path) as f:
            np.savez_compressed(f, meta=np.array(json.dumps(meta, sort_keys=True)),
                                speaker_ids=self.speaker_ids.astype(str), embeddings=self.embeddings.astype(np.float32),
                                genders=self.genders.astype("<U1"), ages_years=self.ages_years.astype(np.float32),
                                corpora=self.corpora.astype(str), f0_quantiles_hz=self.f0_quantiles_hz.astype(np.float32),
                                voiced_frames=self.voiced_frames.astype(np.int32),
                                utt_embeddings=self.utt_embeddings.astype(np.float16),
                                utt_speaker=self.utt_speaker.astype(np.int32))

    @classmethod
    def load(cls, path: str | Path) -> "SpeakerPool":
        path = Path(path)
        check_regular(path, "pool file")  # np.load would wait on a FIFO forever
        if not path.exists():
            raise PoolError(f"{path}: no such pool file; build one with `rtanon pool build --data DIR --out {path}`")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                version = meta.get("format_version")
                if version != POOL_FORMAT_VERSION:
                    raise PoolError(f"{path}: pool format version {version}, this rtanon reads "
                                    f"{POOL_FORMAT_VERSION}; rebuild it with `rtanon pool build`")
                pool = cls(z["speaker_ids"], z["embeddings"].astype(np.float32), z["genders"],
                           z["ages_years"], z["corpora"], z["f0_quantiles_hz"], z["voiced_frames"],
                           z["utt_embeddings"].astype(np.float32), z["utt_speaker"], meta)
        except PoolError:
            raise
        except Exception as exc:
            raise PoolError(f"{path}: not a readable rtanon pool file ({type(exc).__name__}: {exc})") from None
        pool.check()
        return pool

    @classmethod
    def load_default(cls) -> "SpeakerPool":
        """The pool shipped in the package (``rtanon/models/speaker_pool.npz``)."""
        ref = resources.files("rtanon") / "models" / DEFAULT_POOL_FILE
        with resources.as_file(ref) as p:
            return cls.load(p)

    def check(self) -> None:
        s, d = self.embeddings.shape
        for name in ("speaker_ids", "genders", "ages_years", "corpora", "voiced_frames"):
            if getattr(self, name).shape != (s,):
                raise PoolError(f"pool: {name} has shape {getattr(self, name).shape}, expected ({s},)")
        if self.f0_quantiles_hz.shape != (s, self.quantile_levels.shape[0]):
            raise PoolError(f"pool: f0_quantiles_hz has shape {self.f0_quantiles_hz.shape}")
        if self.utt_embeddings.shape[1:] != (d,) or self.utt_speaker.shape != self.utt_embeddings.shape[:1]:
            raise PoolError("pool: utterance embeddings and their speaker index disagree in shape")
        if not set(np.unique(self.genders)) <= {"m", "f"}:
            raise PoolError("pool: genders must be 'm' or 'f'")


def _speaker_stats(encoder, wavs: list, tracker: str, f0_max_seconds: float) -> tuple[list, np.ndarray]:
    """Utterance embeddings and voiced F0 values (Hz) of one speaker's files."""
    from rtanon.io.audio import read_audio
    from rtanon.constants import SAMPLE_RATE_HZ
    from rtanon.identity.pitch import track_f0_hz

    embs, voiced, f0_seconds = [], [], 0.0
    for wav in wavs:
        audio = read_audio(wav)
        embs.append(encoder.embed(audio))
        left = int((f0_max_seconds - f0_seconds) * SAMPLE_RATE_HZ)
        if left >= SAMPLE_RATE_HZ // 2:
            f0, _ = track_f0_hz(audio[:left], tracker)
            voiced.append(f0[f0 > 0])
            f0_seconds += min(left, audio.shape[0]) / SAMPLE_RATE_HZ
    return embs, (np.concatenate(voiced) if voiced else np.zeros(0, np.float32))


_WORKER: dict = {}


def _worker_init(encoder_name: str) -> None:
    import torch

    from rtanon.identity.encoder import make_encoder

    torch.set_num_threads(1)
    _WORKER["encoder"] = make_encoder(encoder_name)


def _worker_job(job: tuple) -> tuple[list, np.ndarray]:
    wavs, tracker, f0_max_seconds = job
    return _speaker_stats(_WORKER["encoder"], wavs, tracker, f0_max_seconds)


def build_pool(data_dirs: list[str | Path], encoder="resemblyzer", *, f0_tracker: str = "auto",
               f0_max_seconds_per_speaker: float = 5.0, progress: bool = True,
               max_speakers: int | None = None, jobs: int = 1) -> SpeakerPool:
    """Embeds every utterance of the Kaldi-style ``data_dirs`` with ``encoder``
    (a :class:`~rtanon.identity.encoder.SpeakerEncoder` or a name for ``make_encoder``).

    Per speaker: embedding = re-normalised mean of its utterance embeddings;
    F0 quantiles from the first ``f0_max_seconds_per_speaker`` of its
    utterances, in order (the tracker is the slow part: Harvest runs at about
    3x real time); age from spk2age when present. ``jobs`` > 1 runs speakers in
    that many processes (``encoder`` must then be a name). ``max_speakers``
    (per directory) is for quick tests.
    """
    from tqdm import tqdm

    from rtanon.identity.encoder import ENCODERS, make_encoder
    from rtanon.identity.pitch import quantiles_hz, resolve_tracker
    from rtanon.io.kaldi import KaldiDir

    tracker = resolve_tracker(f0_tracker)
    dirs = [KaldiDir.load(d) for d in data_dirs]
    jobs_list = []
    for kd in dirs:
        spks = kd.speakers[:max_speakers] if max_speakers else kd.speakers
        for spk in spks:
            if spk not in kd.spk2gender:
                raise PoolError(f"{kd.root}: speaker {spk} has no gender in spk2gender")
            jobs_list.append((kd, spk, [kd.wav[u] for u in kd.utterances_of(spk)]))
    work = [(wavs, tracker, f0_max_seconds_per_speaker) for _, _, wavs in jobs_list]
    if jobs > 1:
        import multiprocessing as mp

        if not isinstance(encoder, str):
            raise ValueError("build_pool(jobs > 1) needs the encoder's name, e.g. 'resemblyzer'")
        encoder_name = ENCODERS[encoder].name if encoder in ENCODERS else encoder
        ctx = mp.get_context("spawn")
        executor = ctx.Pool(jobs, initializer=_worker_init, initargs=(encoder,))
        results = executor.imap(_worker_job, work)
    else:
        executor = None
        encoder = make_encoder(encoder) if isinstance(encoder, str) else encoder
        encoder_name = encoder.name
        results = (_speaker_stats(encoder, *w) for w in work)
    seen: set[str] = set()
    ids, embs, genders, ages, corpora, f0q, nvoiced, utt_embs, utt_spk = [], [], [], [], [], [], [], [], []
    try:
        for (kd, spk, _), (s_embs, voiced_all) in tqdm(zip(jobs_list, results), total=len(jobs_list),
                                                      desc="pool: embedding + F0", unit="spk",
                                                      disable=not progress):
            key = f"{kd.root.name}/{spk}" if spk in seen else spk
            seen.add(spk)
            if voiced_all.size < 20:
                tqdm.write(f"skipping {key}: only {voiced_all.size} voiced frames")
                continue
            idx = len(ids)
            ids.append(key)
            embs.append(unit_norm(np.mean(s_embs, axis=0)))
            genders.append(kd.spk2gender[spk])
            age = kd.spk2age.get(spk)
            ages.append(float(age) if age not in (None, "") else np.nan)
            corpora.append(kd.root.name)
            f0q.append(quantiles_hz(voiced_all))
            nvoiced.append(voiced_all.size)
            utt_embs.extend(s_embs)
            utt_spk.extend([idx] * len(s_embs))
    finally:
        if executor is not None:
            executor.close()
            executor.join()
    if not ids:
        raise PoolError("no speaker with voiced speech in " + ", ".join(str(d) for d in data_dirs))
    meta = {"format_version": POOL_FORMAT_VERSION, "encoder": str(encoder_name),
            "embedding_dim": int(embs[0].shape[0]),
            "f0_tracker": tracker, "f0_frame_ms": 10, "f0_max_seconds_per_speaker": f0_max_seconds_per_speaker,
            "quantile_levels": QUANTILE_LEVELS.tolist(), "sources": [str(kd.root.name) for kd in dirs],
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    pool = SpeakerPool(np.array(ids), np.stack(embs), np.array(genders), np.array(ages, np.float32),
                       np.array(corpora), np.stack(f0q), np.array(nvoiced, np.int32),
                       np.stack(utt_embs).astype(np.float32), np.array(utt_spk, np.int32), meta)
    pool.check()
    return pool
