"""Held-out figures for the content encoder (run on so762_dev, never trained on).

    rtanon lab content-eval --cache CACHE/so762_dev --kmeans CACHE/kmeans_K128.npz [--onnx PATH]

1. **Teacher agreement**: the student's most probable unit vs the teacher's
   k-means unit, frame by frame (top-1 and top-5), with the share of the most
   frequent unit as the trivial reference.
2. **Teacher detail in z**: a ridge regression from the student's projection z
   (what the neural vocoder reads) to the standardised teacher features, fitted
   on the utterances of half the speakers and scored (R^2, averaged over the
   384 dimensions) on the other half's; the same probe on the student's soft
   units for reference. Higher = more of the teacher's phonetic detail.
3. **Speaker information left**: per utterance, pool a feature sequence into
   its mean and standard deviation over time; a standardised multinomial
   logistic regression learns the speakers from some of each speaker's
   utterances and is tested on their held-out utterances (k-fold over the
   utterances of every speaker). The same classifier runs on log-mel
   (80 bins, 25/10 ms), on the teacher's Whisper features, on the student's
   soft units and projections. Lower accuracy = less speaker information.

Needs the cache written by ``rtanon train content`` (``features.build_cache``
on the evaluation directory gives the teacher units for it) and scikit-learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rtanon.constants import FRAME_SAMPLES


def _pool(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x.mean(0), x.std(0)])


def speaker_id_accuracy(features: list[np.ndarray], speakers: list[str], folds: int = 4, seed: int = 0) -> float:
    """Mean held-out accuracy of a speaker classifier on pooled per-utterance features.

    ``features[i]`` is (T_i, F) for utterance i. Each speaker's utterances are split
    into ``folds`` groups; fold j trains on the others and tests on group j."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.stack([_pool(f) for f in features])
    y = np.asarray(speakers)
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(y), dtype=int)
    for s in np.unique(y):
        idx = np.flatnonzero(y == s)
        fold[rng.permutation(idx)] = np.arange(len(idx)) % folds
    accs = []
    for j in range(folds):
        tr, te = fold != j, fold == j
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
        clf.fit(X[tr], y[tr])
        accs.append(float((clf.predict(X[te]) == y[te]).mean()))
    return float(np.mean(accs))


def teacher_probe_r2(features: list[np.ndarray], teacher: list[np.ndarray], speakers: list[str]) -> float:
    """Held-out-speaker R^2 of a ridge regression from per-frame features to standardised teacher frames:
    fitted on the utterances of every other speaker (sorted by id), scored on the rest's."""
    from sklearn.linear_model import Ridge

    ids = sorted(set(speakers))
    fit_spk = set(ids[::2])
    fit = [i for i, s in enumerate(speakers) if s in fit_spk]
    test = [i for i, s in enumerate(speakers) if s not in fit_spk]
    T_fit = np.concatenate([teacher[i] for i in fit])
    mean, std = T_fit.mean(0), T_fit.std(0) + 1e-5
    reg = Ridge(alpha=1.0).fit(np.concatenate([features[i] for i in fit]), (T_fit - mean) / std)
    y = (np.concatenate([teacher[i] for i in test]) - mean) / std
    pred = reg.predict(np.concatenate([features[i] for i in test]))
    r2 = 1.0 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)
    return float(r2.mean())


def log_mel(audio: np.ndarray) -> np.ndarray:
    """(T, 80) natural-log mel energies, 25 ms window, 10 ms hop, 16 kHz input."""
    import librosa

    m = librosa.feature.melspectrogram(y=audio, sr=16000, n_fft=512, win_length=400, hop_length=160, n_mels=80,
                                       center=False)
    return np.log(m + 1e-6).T


def evaluate(cache_dir: Path, kmeans: Path, onnx_path: Path | None = None) -> dict:
    """Teacher agreement and speaker information left (see the module docstring)."""
    from rtanon.train.teacher import CorpusCache, assign_units
    from rtanon.content.stream import ContentEncoderModel

    cache = CorpusCache.load(Path(cache_dir))
    km = dict(np.load(kmeans))
    k = int(km["centers"].shape[0])
    units = assign_units(cache, km, k)
    teacher = cache.teacher(mmap=False).astype(np.float32)
    audio = cache.audio(mmap=False)
    model = ContentEncoderModel(onnx_path)
    if model.n_units != k:
        raise ValueError(f"the model has {model.n_units} units, the k-means {k}: pass the matching --kmeans")
    top1 = top5 = total = 0
    feats = {"log-mel (80)": [], "teacher Whisper features (384)": [], "teacher hard units (one-hot)": [],
             "student soft units p (K)": [], "student projection z (D)": [],
             "student unit-norm projection z/|z| (D)": []}
    for i in range(len(cache.utts)):
        n = int(cache.frame_len[i])
        if n < 5:
            continue
        o = int(cache.audio_offset[i])
        x = audio[o:o + n * FRAME_SAMPLES].astype(np.float32) / 32767.0
        probs, z = model.analyze(x)
        f0 = int(cache.frame_offset[i])
        u = units[f0:f0 + n].astype(np.int64)
        top1 += int((probs.argmax(1) == u).sum())
        top5 += int((np.argsort(-probs, axis=1)[:, :5] == u[:, None]).any(1).sum())
        total += n
        feats["log-mel (80)"].append(log_mel(x))
        feats["teacher Whisper features (384)"].append(teacher[f0:f0 + n])
        feats["teacher hard units (one-hot)"].append(np.eye(k, dtype=np.float32)[u])
        feats["student soft units p (K)"].append(probs)
        feats["student projection z (D)"].append(z)
        feats["student unit-norm projection z/|z| (D)"].append(z / np.linalg.norm(z, axis=1, keepdims=True))
    spk = [cache.spk[i] for i in range(len(cache.utts)) if cache.frame_len[i] >= 5]
    counts = np.bincount(units.astype(np.int64), minlength=k)
    result = {
        "utterances": len(spk), "speakers": len(set(spk)), "frames": total, "n_units": k,
        "agreement_top1": top1 / total, "agreement_top5": top5 / total,
        "most_frequent_unit_share": float(counts.max() / counts.sum()),
        "teacher_probe_r2": {
            "student projection z (D)": teacher_probe_r2(feats["student projection z (D)"],
                                                         feats["teacher Whisper features (384)"], spk),
            "student soft units p (K)": teacher_probe_r2(feats["student soft units p (K)"],
                                                         feats["teacher Whisper features (384)"], spk)},
        "speaker_id_accuracy": {name: speaker_id_accuracy(f, spk) for name, f in feats.items()},
        "speaker_id_chance": 1.0 / len(set(spk)),
    }
    return result


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True, help="cache dir of the evaluation split (so762_dev)")
    ap.add_argument("--kmeans", type=Path, required=True, help="kmeans_K<k>.npz fitted on the training data")
    ap.add_argument("--onnx", type=Path, default=None, help="ONNX encoder (default: the packaged model)")
    args = ap.parse_args(argv)
    r = evaluate(args.cache, args.kmeans, args.onnx)
    print(f"{r['utterances']} utterances, {r['speakers']} speakers, {r['frames']} frames of 20 ms, K={r['n_units']}")
    print(f"teacher agreement: top-1 {r['agreement_top1']:.3f}, top-5 {r['agreement_top5']:.3f} "
          f"(most frequent unit: {r['most_frequent_unit_share']:.3f})")
    print("teacher detail (ridge probe to the teacher's features, R^2 on held-out speakers): " +
          ", ".join(f"{name} {v:.3f}" for name, v in r["teacher_probe_r2"].items()))
    print(f"speaker identification on held-out utterances (chance {r['speaker_id_chance']:.3f}):")
    print("| features | accuracy |\n|---|---|")
    for name, acc in r["speaker_id_accuracy"].items():
        print(f"| {name} | {acc:.3f} |")
    print(json.dumps(r))
    return 0

