"""Vocoder training data: feature shards, written from Kaldi-style directories and read as a dataset.

``build_shards(data_dirs, out_dir, extractors, units_dim)`` reads Kaldi-style
directories (``so762_train``, ``libri_clips``), optionally perturbs each
utterance (``augmentations``, e.g. :func:`speed_perturbation`), runs the
extractors and writes shards (:class:`ShardWriter`; :class:`ShardDataset` reads them). The extractors are
callables so the content encoder, the F0 tracker and the speaker encoder can
be plugged in when they exist:

- ``units(audio) -> (T, D)`` float32 at 50 Hz: frame ``t`` describes samples
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
has the word ``dev``, ``test`` or ``eval`` (``devclean`` too: :func:`looks_like_eval_dir`) is refused unless
``allow_eval_dirs`` is set.

Shard directory layout (written by :class:`ShardWriter`, read by :class:`ShardDataset`)::

    shards/
      manifest.json      format, units_dim, the content encoder's sha256, rates, speaker ids, one entry per shard
                         (file, utterances, frames, bytes, sha256)
      speakers.npz       embeddings float32 (n_speakers, 256): one per *training* speaker
      shard_00000.npz    one shard: many utterances concatenated
      ...

One shard (``np.savez``; uncompressed so it memory-maps quickly, a 16 MiB
default cap so that a machine that only sees a 64 MiB working tree can carry
a few at a time and accumulate them between calls)::

    units    float16 (sum T, D)    the content encoder's projections z at 50 Hz
    f0_hz    float32 (sum 2T,)     F0 at 100 Hz, 0 = unvoiced
    audio    int16   (sum 320T,)   16 kHz target audio
    frames   int32   (U,)          T of each utterance (offsets are the cumulative sums)
    speaker  int32   (U,)          row of speakers.npz for each utterance
    utt_ids  str     (U,)

Sizes: about 58 KB per second of speech with D = 256 (audio 32 KB/s, units
25.6 KB/s, F0 0.8 KB/s), so a 16 MiB shard holds about 5 minutes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from rtanon.atomic import atomic_open, write_text
from rtanon.constants import FRAME_RATE_HZ, FRAME_SAMPLES, HOP_RATE_HZ, SAMPLE_RATE_HZ

SHARD_FORMAT = "rtanon-vocoder-shards-v1"


class ShardWriter:
    """Writes utterances into shards of at most ``max_shard_mib`` MiB plus the manifest.

    ``add(utt_id, speaker_index, units (T, D), f0_hz (2T,), audio (320 T,) float in [-1, 1] or int16)``;
    ``close(speaker_ids, speaker_embeddings (n, S) float32)`` writes the last shard, ``speakers.npz`` and
    ``manifest.json``. Use as a context manager only when the speakers are known up front.
    """

    def __init__(self, out_dir: str | Path, units_dim: int, max_shard_mib: float = 16.0,
                 content_sha256: str = "") -> None:
        self.out_dir = Path(out_dir)
        self.content_sha256 = content_sha256
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.units_dim = units_dim
        self.max_bytes = int(max_shard_mib * 2**20)
        self._entries: list[dict] = []
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._buf: dict[str, list] = {"units": [], "f0_hz": [], "audio": [], "frames": [], "speaker": [],
                                      "utt_ids": []}
        self._bytes = 0

    def add(self, utt_id: str, speaker_index: int, units: np.ndarray, f0_hz: np.ndarray,
            audio: np.ndarray) -> None:
        t = units.shape[0]
        if units.ndim != 2 or units.shape[1] != self.units_dim:
            raise ValueError(f"{utt_id}: units must be (T, {self.units_dim}), got {units.shape}")
        if f0_hz.shape != (2 * t,) or audio.shape != (FRAME_SAMPLES * t,):
            raise ValueError(f"{utt_id}: for T={t} frames f0_hz must be ({2 * t},) at 100 Hz and audio "
                             f"({FRAME_SAMPLES * t},) at 16 kHz; got {f0_hz.shape} and {audio.shape} "
                             "(trim the audio to a whole number of 20 ms frames)")
        if audio.dtype != np.int16:
            audio = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
        size = t * (2 * self.units_dim + 8 + 2 * FRAME_SAMPLES)
        if self._bytes and self._bytes + size > self.max_bytes:
            self._flush()
        self._buf["units"].append(units.astype(np.float16))
        self._buf["f0_hz"].append(f0_hz.astype(np.float32))
        self._buf["audio"].append(audio)
        self._buf["frames"].append(t)
        self._buf["speaker"].append(int(speaker_index))
        self._buf["utt_ids"].append(str(utt_id))
        self._bytes += size

    def _flush(self) -> None:
        if not self._buf["frames"]:
            return
        name = f"shard_{len(self._entries):05d}.npz"
        path = self.out_dir / name
        with atomic_open(path) as f:
            np.savez(f, units=np.concatenate(self._buf["units"]), f0_hz=np.concatenate(self._buf["f0_hz"]),
                     audio=np.concatenate(self._buf["audio"]), frames=np.asarray(self._buf["frames"], np.int32),
                     speaker=np.asarray(self._buf["speaker"], np.int32), utt_ids=np.asarray(self._buf["utt_ids"]))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self._entries.append({"file": name, "utterances": len(self._buf["frames"]),
                              "frames": int(sum(self._buf["frames"])), "bytes": path.stat().st_size,
                              "sha256": digest})
        self._reset_buffer()

    def close(self, speaker_ids: list[str], speaker_embeddings: np.ndarray) -> Path:
        self._flush()
        emb = np.asarray(speaker_embeddings, np.float32)
        if emb.ndim != 2 or emb.shape[0] != len(speaker_ids):
            raise ValueError(f"speaker_embeddings must be ({len(speaker_ids)}, S), got {emb.shape}")
        with atomic_open(self.out_dir / "speakers.npz") as f:
            np.savez(f, embeddings=emb, ids=np.asarray(speaker_ids))
        manifest = {"format": SHARD_FORMAT, "units_dim": self.units_dim, "units_kind": "z",
                    "content_sha256": self.content_sha256,
                    "speaker_dim": int(emb.shape[1]),
                    "sample_rate_hz": SAMPLE_RATE_HZ, "frame_rate_hz": FRAME_RATE_HZ, "f0_rate_hz": HOP_RATE_HZ,
                    "speakers": list(speaker_ids), "shards": self._entries}
        path = self.out_dir / "manifest.json"
        write_text(path, json.dumps(manifest, indent=1))
        return path


class ShardDataset:
    """The utterances of the shards in ``shard_dir`` that are present (all listed ones by default, or
    the files named in ``shards``), held in memory, with random fixed-length segments.

    ``batch(rng, batch_size, segment_frames)`` -> dict of numpy arrays: ``units`` (B, S, D) float32,
    ``f0_hz`` (B, 2S) float32, ``audio`` (B, 320 S) float32 in [-1, 1], ``speaker`` (B,) int64 rows of
    ``embeddings`` (n_speakers, D) float32. Utterances shorter than a segment are zero-padded (silence,
    unvoiced) at the end.
    """

    def __init__(self, shard_dir: str | Path, shards: list[str] | None = None, verify: bool = False) -> None:
        shard_dir = Path(shard_dir)
        manifest = json.loads((shard_dir / "manifest.json").read_text())
        if manifest.get("format") != SHARD_FORMAT:
            raise ValueError(f"{shard_dir} is not a {SHARD_FORMAT} directory (format {manifest.get('format')!r})")
        self.manifest = manifest
        self.units_dim = int(manifest["units_dim"])
        if manifest.get("units_kind", "probs") != "z":
            raise ValueError(f"{shard_dir} holds soft units, a retired kind of content: build new shards "
                             "(`rtanon train vocoder --out NEW_DIR`)")
        #: the content encoder that made the units ("" in shards from before it was recorded)
        self.content_sha256 = str(manifest.get("content_sha256", ""))
        spk = np.load(shard_dir / "speakers.npz")
        self.embeddings = spk["embeddings"].astype(np.float32)
        wanted = set(shards) if shards is not None else None
        entries = [e for e in manifest["shards"] if (wanted is None or e["file"] in wanted)
                   and (shard_dir / e["file"]).exists()]
        if not entries:
            raise FileNotFoundError(f"no shard files of {shard_dir}/manifest.json are present"
                                    + (f" among {sorted(wanted)}" if wanted else ""))
        units, f0, audio, frames, speaker = [], [], [], [], []
        for e in entries:
            path = shard_dir / e["file"]
            if verify and hashlib.sha256(path.read_bytes()).hexdigest() != e["sha256"]:
                raise ValueError(f"{path} does not match its sha256 in the manifest (partial copy?)")
            with np.load(path) as z:
                units.append(z["units"])
                f0.append(z["f0_hz"])
                audio.append(z["audio"])
                frames.append(z["frames"])
                speaker.append(z["speaker"])
        self.units = np.concatenate(units)
        self.f0_hz = np.concatenate(f0)
        self.audio = np.concatenate(audio)
        self.frames = np.concatenate(frames).astype(np.int64)
        self.speaker = np.concatenate(speaker).astype(np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.frames)[:-1]))
        self.shard_files = [e["file"] for e in entries]

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    @property
    def total_seconds(self) -> float:
        return float(self.frames.sum()) / FRAME_RATE_HZ

    def batch(self, rng: np.random.Generator, batch_size: int, segment_frames: int) -> dict[str, np.ndarray]:
        k, s = self.units_dim, segment_frames
        out = {"units": np.zeros((batch_size, s, k), np.float32), "f0_hz": np.zeros((batch_size, 2 * s), np.float32),
               "audio": np.zeros((batch_size, FRAME_SAMPLES * s), np.float32),
               "speaker": np.zeros(batch_size, np.int64)}
        # utterances drawn in proportion to their length, so every second of speech is equally likely
        p = self.frames / self.frames.sum()
        for b, u in enumerate(rng.choice(len(self), size=batch_size, p=p)):
            n = int(self.frames[u])
            start = int(rng.integers(0, n - s + 1)) if n > s else 0
            m = min(s, n - start)
            f = int(self.offsets[u]) + start
            out["units"][b, :m] = self.units[f:f + m]
            out["f0_hz"][b, :2 * m] = self.f0_hz[2 * f:2 * (f + m)]
            out["audio"][b, :FRAME_SAMPLES * m] = self.audio[FRAME_SAMPLES * f:FRAME_SAMPLES * (f + m)] / 32768.0
            out["speaker"][b] = self.speaker[u]
        return out


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


def default_extractors(f0_kernel: str = "auto", content_onnx: str | Path | None = None,
                       content=None) -> Extractors:
    """rtanon's content encoder (the packaged one, or the graph ``content_onnx``: its projections ``z``; or
    ``content``, anything with ``encode(audio)``, ``output_dim`` and ``sha256``, such as the whole-utterance
    :class:`rtanon.train.whisper.UtteranceContent`), F0 tracker and speaker embeddings (pool first,
    resemblyzer otherwise)."""
    from rtanon.f0.tracker import track
    from rtanon.identity.pool import SpeakerPool, unit_norm

    if content is None:
        from rtanon.content.stream import ContentEncoderModel

        content = ContentEncoderModel(content_onnx)
    pool = SpeakerPool.load_default()
    row = {str(s): i for i, s in enumerate(pool.speaker_ids)}
    encoder = None

    def speaker_embedding(audios: list[np.ndarray]) -> np.ndarray:
        nonlocal encoder
        if encoder is None:
            from rtanon.identity.encoder import make_encoder

            encoder = make_encoder("resemblyzer")
        return unit_norm(np.mean([encoder.embed(a) for a in audios], axis=0))

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
    t = min(units.shape[0], f0.shape[0] // 2, audio.shape[0] // FRAME_SAMPLES)
    return units[:t], f0[:2 * t], audio[:FRAME_SAMPLES * t]


def looks_like_eval_dir(name: str) -> bool:
    """Whether a data directory's name marks it as evaluation data: a word ``dev``, ``test`` or ``eval`` in
    it, alone or as LibriSpeech names its splits (``so762_dev``, ``dev-other``, ``libri_devclean``,
    ``test_clean``), not another word that starts so (``device_recordings``)."""
    import re

    return any(re.fullmatch(r"(dev|test|eval)(clean|other)?", w) for w in re.split(r"[^a-z0-9]+", name.lower()))


def build_shards(data_dirs: list[str | Path], out_dir: str | Path, extractors: Extractors, units_dim: int, *,
                 augmentations: tuple[Augmentation, ...] = (), max_shard_mib: float = 16.0,
                 speakers: set[str] | None = None, min_frames: int = 10, allow_eval_dirs: bool = False,
                 progress: bool = True) -> Path:
    """Writes shards for every utterance (of ``speakers`` only, when given) of ``data_dirs``, plus one
    perturbed copy per augmentation; returns the manifest path. Speakers are processed one at a time
    (their utterances in memory together, for the embedding)."""
    from tqdm import tqdm

    from rtanon.io.audio import read_audio
    from rtanon.io.kaldi import KaldiDir

    dirs = [KaldiDir.load(d) for d in data_dirs]
    for d in dirs:
        name = d.root.resolve().name.lower()
        if not allow_eval_dirs and looks_like_eval_dir(name):
            raise ValueError(f"{d.root} looks like evaluation data; never train on it (so762_dev is for "
                             "evaluation only). Pass allow_eval_dirs=True only for a deliberate exception.")
    writer = ShardWriter(out_dir, units_dim, max_shard_mib, content_sha256=extractors.content_sha256)
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
