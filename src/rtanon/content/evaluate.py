"""Held-out figures for the content encoder (run on so762_dev, never trained on).

    python -m rtanon.content.evaluate --cache CACHE/so762_dev --kmeans CACHE/kmeans_K128.npz [--onnx PATH]

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

4. **Phone error rate** (``--ctc-checkpoint CKPT``, a checkpoint trained with
   ``--phone-ctc``): the training-only phone head on z, best-path CTC
   decoding, against espeak-ng's phones of the transcripts: how well z tells
   the phones apart on unseen speakers and sentences.

Choosing the temperature of the units the neural method uses must not look
at so762_dev: ``--shards DIR`` measures the same speaker-ID figure on the
training speakers' utterances from vocoder feature shards (``rtanon train
vocoder`` writes them; the units there are the shipped encoder's at 0.1).

Needs the cache written by ``rtanon train content`` (``features.build_cache``
on the evaluation directory gives the teacher units for it) and scikit-learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rtanon.content.config import FRAME_SAMPLES


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


def evaluate(cache_dir: Path, kmeans: Path, onnx_path: Path | None = None,
             temperatures: tuple[float, ...] = ()) -> dict:
    """Teacher agreement and speaker information left (see the module docstring); ``temperatures`` adds
    the soft units sharpened to each Eq. 1 temperature (``sharpen_units``) to the speaker-ID table."""
    from rtanon.content.features import CorpusCache, assign_units
    from rtanon.content.stream import ContentEncoderModel, ContentStreamConfig, sharpen_units

    cache = CorpusCache.load(Path(cache_dir))
    km = dict(np.load(kmeans))
    k = int(km["centers"].shape[0])
    units = assign_units(cache, km, k)
    teacher = cache.teacher(mmap=False).astype(np.float32)
    audio = cache.audio(mmap=False)
    model = ContentEncoderModel(onnx_path, ContentStreamConfig(output="probs"))
    if model.n_units != k:
        raise ValueError(f"the model has {model.n_units} units, the k-means {k}: pass the matching --kmeans")
    top1 = top5 = total = 0
    feats = {"log-mel (80)": [], "teacher Whisper features (384)": [], "teacher hard units (one-hot)": [],
             "student soft units p (K)": [], "student projection z (D)": [],
             "student unit-norm projection z/|z| (D)": []}
    feats.update({f"student soft units p (K) at temperature {t:g}": [] for t in temperatures})
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
        for t in temperatures:
            feats[f"student soft units p (K) at temperature {t:g}"].append(sharpen_units(probs, t))
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


def speaker_id_on_shards(shard_dir: Path, temperatures: tuple[float, ...], speaker_prefix: str = "so") -> dict:
    """Speaker-ID accuracy of pooled soft units (at 0.1 and each of ``temperatures``) over the utterances of
    the shard speakers whose id starts with ``speaker_prefix`` (so762_train: 14 utterances each)."""
    from rtanon.content.stream import sharpen_units
    from rtanon.neural.train import ShardDataset

    data = ShardDataset(shard_dir)
    ids = np.asarray(data.manifest["speakers"])
    keep = [i for i in range(len(data)) if str(ids[data.speaker[i]]).startswith(speaker_prefix)]
    spk = [str(ids[data.speaker[i]]) for i in keep]
    units = [data.units[data.offsets[i]:data.offsets[i] + data.frames[i]].astype(np.float32) for i in keep]
    result = {"utterances": len(keep), "speakers": len(set(spk)), "speaker_id_accuracy": {}}
    for t in (0.1, *temperatures):
        result["speaker_id_accuracy"][f"soft units at temperature {t:g}"] = speaker_id_accuracy(
            [sharpen_units(u, t) for u in units], spk)
    return result


def phone_error_rate(checkpoint: Path, cache_dir: Path) -> dict:
    """Phone error rate of a ``--phone-ctc`` checkpoint's phone head on the cached utterances (torch, offline
    from the zero state, as a fresh stream), against espeak-ng's phones of their transcripts (cached as
    ``phones.json`` beside the audio). Phones the training inventory lacks count as errors."""
    import torch

    from rtanon.content.features import CorpusCache
    from rtanon.content.phones import build_phones, ctc_greedy
    from rtanon.content.train import load_checkpoint
    from rtanon.eval.metrics import error_counts

    ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
    if not ck.get("ctc_head"):
        raise ValueError(f"{checkpoint} has no phone head: train with --phone-ctc W")
    inventory = ck["phones"]
    model = load_checkpoint(checkpoint)
    head = torch.nn.Linear(model.cfg.unit_dim, len(inventory))
    head.load_state_dict(ck["ctc_head"])
    cache = CorpusCache.load(Path(cache_dir))
    source = json.loads((Path(cache_dir) / "index.json").read_text())["source"]
    table = build_phones(Path(source), Path(cache_dir))
    audio = cache.audio(mmap=True)
    la = model.cfg.lookahead_frames
    subs = dels = ins = n_ref = 0
    with torch.no_grad():
        for i, utt in enumerate(cache.utts):
            if utt not in table or int(cache.frame_len[i]) < 5:
                continue
            o, n = int(cache.audio_offset[i]), int(cache.frame_len[i]) * FRAME_SAMPLES
            x = np.zeros(n + la * FRAME_SAMPLES, dtype=np.float32)
            x[:n] = np.asarray(audio[o:o + n], dtype=np.float32) / 32767.0
            z = model(torch.from_numpy(x)[None], *model.init_state())[1][0, la:]
            hyp = [inventory[k] for k in ctc_greedy(head(z).argmax(-1).tolist())]
            s, d, e = error_counts(table[utt], hyp)
            subs, dels, ins, n_ref = subs + s, dels + d, ins + e, n_ref + len(table[utt])
    return {"phones": n_ref, "per": (subs + dels + ins) / max(n_ref, 1), "substitutions": subs / max(n_ref, 1),
            "deletions": dels / max(n_ref, 1), "insertions": ins / max(n_ref, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtanon.content.evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, help="cache dir of the evaluation split (so762_dev)")
    ap.add_argument("--kmeans", type=Path, help="kmeans_K<k>.npz fitted on the training data")
    ap.add_argument("--shards", type=Path, help="instead: speaker-ID of the units of the training speakers in these "
                                                "vocoder feature shards, to choose the temperature")
    ap.add_argument("--onnx", type=Path, default=None, help="ONNX encoder (default: the packaged model)")
    ap.add_argument("--ctc-checkpoint", type=Path, default=None, metavar="CKPT",
                    help="also the phone error rate of this --phone-ctc training checkpoint's phone head on --cache")
    ap.add_argument("--temperatures", type=float, nargs="*", default=[0.05, 0.025],
                    help="also measure the soft units sharpened to these temperatures (default 0.05 0.025)")
    args = ap.parse_args(argv)
    if args.shards:
        r = speaker_id_on_shards(args.shards, tuple(args.temperatures))
        print(f"{r['utterances']} utterances of {r['speakers']} training speakers; speaker-ID accuracy "
              f"(chance {1 / r['speakers']:.3f}):")
        for name, acc in r["speaker_id_accuracy"].items():
            print(f"| {name} | {acc:.3f} |")
        print(json.dumps(r))
        return 0
    if args.cache is None or args.kmeans is None:
        ap.error("give --cache and --kmeans (evaluation), or --shards (temperature choice on training speakers)")
    if args.ctc_checkpoint is not None:
        p = phone_error_rate(args.ctc_checkpoint, args.cache)
        print(f"phone error rate ({args.ctc_checkpoint}, {p['phones']} phones): {100 * p['per']:.1f} % = "
              f"{100 * p['substitutions']:.1f} S + {100 * p['deletions']:.1f} D + {100 * p['insertions']:.1f} I")
        print(json.dumps(p))
    r = evaluate(args.cache, args.kmeans, args.onnx, tuple(args.temperatures))
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


if __name__ == "__main__":
    raise SystemExit(main())
