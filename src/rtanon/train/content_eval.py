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



def _ctc_greedy(log_probs: np.ndarray, tokens: list[str]) -> list[str]:
    """Greedy CTC: argmax per frame, repeats collapsed, blank and word boundary dropped."""
    ids = log_probs.argmax(-1)
    keep = np.concatenate([[True], ids[1:] != ids[:-1]])
    return [tokens[i] for i in ids[keep] if tokens[i] not in ("<blank>", "<wb>")]


def phone_error_rates(checkpoint: Path, data_dirs: list[Path], per_speaker: int | None, seed: int = 0) -> dict:
    """The causal phone recognizer (a ``--phone-weight`` checkpoint's phone head on ``z``, with the
    encoder's own lookahead) and hama's non-causal one on evaluation sets: PER of each against the
    transcripts' canonical phones (hama's G2P), and of the student against hama's own phones."""
    import hama
    import torch

    from rtanon.audio_io import read_audio
    from rtanon.eval.metrics import error_counts
    from rtanon.eval.runner import _per_speaker
    from rtanon.eval.textnorm import normalize
    from rtanon.kaldi import KaldiDir
    from rtanon.train.content import PHONE_TOKENS, load_checkpoint

    ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
    if not ck.get("phone_head"):
        raise SystemExit(f"{checkpoint}: no phone head (train with --phone-weight)")
    model = load_checkpoint(checkpoint)
    head = torch.nn.Linear(model.cfg.unit_dim, PHONE_TOKENS)
    head.load_state_dict(ck["phone_head"])
    la = model.cfg.lookahead_frames
    teacher = hama.ASRModel()
    g2p = hama.G2PModel()
    tokens = teacher.decoder_tokens
    out = {}
    for d in data_dirs:
        kd = _per_speaker(KaldiDir.load(d), per_speaker, seed)
        err = {"student_vs_text": np.zeros(2), "hama_vs_text": np.zeros(2), "student_vs_hama": np.zeros(2)}
        for u in sorted(kd.wav):
            if u not in kd.text:
                continue
            x = read_audio(kd.wav[u])
            canonical = [a.phoneme for a in g2p.predict(" ".join(normalize(kd.text[u]))).alignments
                         if a.phoneme.strip()]
            heard = list(teacher.transcribe_waveform(x, 16000).phonemes)
            audio = torch.from_numpy(np.concatenate([x, np.zeros(la * FRAME_SAMPLES, np.float32)]))[None]
            with torch.no_grad():
                state = model.init_state(1)
                logmel, _ = model.log_mel(audio, state[0])
                _, z, _ = model.encode_logmel(logmel, state[1:])
                lp = torch.log_softmax(head(z[:, la:]), -1)[0].numpy()
            said = _ctc_greedy(lp, tokens)
            for key, ref, hyp in (("student_vs_text", canonical, said), ("hama_vs_text", canonical, heard),
                                  ("student_vs_hama", heard, said)):
                err[key] += (sum(error_counts(ref, hyp)), len(ref))
        out[Path(d).name] = {k: float(v[0] / max(1, v[1])) for k, v in err.items()}
        out[Path(d).name]["utterances"] = sum(1 for u in kd.wav if u in kd.text)
    return out


def main_phones(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=phone_error_rates.__doc__)
    ap.add_argument("checkpoint", type=Path, help="ckpt.pt of `rtanon train content --phone-weight W`")
    ap.add_argument("--data", type=Path, nargs="+", required=True, help="evaluation sets with transcripts")
    ap.add_argument("--utts-per-speaker", type=int, default=None, help="a seeded few per speaker (default all)")
    args = ap.parse_args(argv)
    r = phone_error_rates(args.checkpoint, args.data, args.utts_per_speaker)
    print("| set | utterances | PER causal student vs text | PER hama vs text | PER student vs hama |")
    print("|---|---|---|---|---|")
    for name, f in r.items():
        print(f"| {name} | {f['utterances']} | {100 * f['student_vs_text']:.1f} % | {100 * f['hama_vs_text']:.1f} % "
              f"| {100 * f['student_vs_hama']:.1f} % |")
    print(json.dumps(r))
    return 0
