"""Speaker perturbation of a training cache: a WORLD resynthesis of every utterance
with its F0 scaled and its spectral envelope kept (ContentVec, Qian et al. 2022).

The copy ``audio_pitch.npy`` (int16) has the layout of the cache's ``audio.npy``:
every utterance at the same offset and length, so a crop of the copy keeps the
time alignment of the original's teacher targets. The student reading the copy
is trained on the *unperturbed* utterance's targets, so what varies with the
voice's pitch cannot help it. Each utterance gets one factor, log-uniform in
``factor_range``, from a generator seeded by ``seed`` and the utterance index
(deterministic, whatever the number of jobs).
"""

from __future__ import annotations

import logging
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from rtanon.atomic import atomic_open
from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.train.teacher import CorpusCache, need_module

log = logging.getLogger(__name__)

PITCH_FILE = "audio_pitch.npy"
FRAME_PERIOD_MS = 5.0


def pitch_factor(seed: int, index: int, factor_range: tuple[float, float]) -> float:
    lo, hi = np.log(factor_range[0]), np.log(factor_range[1])
    return float(np.exp(np.random.default_rng([seed, index]).uniform(lo, hi)))


def world_pitch_shift(x: np.ndarray, factor: float) -> np.ndarray:
    """``x`` (int16 or float) resynthesised by WORLD with F0 times ``factor``; same length, int16."""
    pw = need_module("pyworld")
    xf = np.asarray(x, np.float64) / 32767.0
    if len(xf) < SAMPLE_RATE_HZ // 20:  # too short to analyse: silence keeps the alignment
        return np.zeros(len(xf), np.int16)
    f0, t = pw.dio(xf, SAMPLE_RATE_HZ, frame_period=FRAME_PERIOD_MS)
    f0 = pw.stonemask(xf, f0, t, SAMPLE_RATE_HZ)
    sp = pw.cheaptrick(xf, f0, t, SAMPLE_RATE_HZ)
    ap = pw.d4c(xf, f0, t, SAMPLE_RATE_HZ)
    y = pw.synthesize(f0 * factor, sp, ap, SAMPLE_RATE_HZ, FRAME_PERIOD_MS)
    y = np.pad(y, (0, max(0, len(xf) - len(y))))[: len(xf)]
    return np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)


def _shift_one(args) -> np.ndarray:
    x, factor = args
    return world_pitch_shift(x, factor)


def build_pitch_copy(cache: CorpusCache, factor_range: tuple[float, float], seed: int = 0,
                     jobs: int = 1) -> np.ndarray:
    """The cache's pitch-shifted copy (built once, then read from disk; int16, memory-mapped)."""
    path = cache.root / PITCH_FILE
    if path.exists():
        return np.load(path, mmap_mode="r")
    from tqdm import tqdm

    audio = cache.audio(mmap=True)
    out = np.zeros(audio.shape, np.int16)
    work = ((np.asarray(audio[o:o + n]), pitch_factor(seed, i, factor_range))
            for i, (o, n) in enumerate(zip(cache.audio_offset, cache.audio_len)))
    bar = tqdm(total=len(cache.utts), desc=f"WORLD pitch copy of {cache.root.name}", unit="utt")
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for (o, n), y in zip(zip(cache.audio_offset, cache.audio_len), pool.map(_shift_one, work, chunksize=8)):
            out[o:o + n] = y
            bar.update()
    bar.close()
    with atomic_open(Path(path)) as f:
        np.save(f, out)
    log.info("pitch copy of %s: %d utterances, factors log-uniform in %s", cache.root.name, len(cache.utts),
             factor_range)
    return np.load(path, mmap_mode="r")
