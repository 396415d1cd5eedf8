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


def evaluate(cache_dir: Path, kmeans: Path, onnx_path: Path | None = None, model=None) -> dict:
    """Teacher agreement and speaker information left (see the module docstring); ``model`` (anything with
    ``n_units`` and ``analyze(audio) -> (probs, z)``) in place of the ONNX graph at ``onnx_path``."""
    from rtanon.train.teacher import CorpusCache, assign_units
    from rtanon.content.stream import ContentEncoderModel

    cache = CorpusCache.load(Path(cache_dir))
    km = dict(np.load(kmeans))
    k = int(km["centers"].shape[0])
    units = assign_units(cache, km, k)
    teacher = cache.teacher(mmap=False).astype(np.float32)
    audio = cache.audio(mmap=False)
    model = model or ContentEncoderModel(onnx_path)
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
    ap.add_argument("--whisper", choices=("tiny.en",), default=None,
                    help="instead of an ONNX encoder: Whisper's own encoder run causally with no training "
                         "(the zero-shot streaming form, rtanon.train.whisper); its units are the k-means "
                         "units nearest to its standardised frames (tiny.en only: the units are its teacher's)")
    ap.add_argument("--window-frames", type=int, default=100,
                    help="with --whisper: frames of 20 ms each frame attends to, itself included (default 100)")
    args = ap.parse_args(argv)
    model = None
    if args.whisper:
        from rtanon.train.whisper import ZeroShotContent

        model = ZeroShotContent(args.whisper, args.window_frames, dict(np.load(args.kmeans)))
    r = evaluate(args.cache, args.kmeans, args.onnx, model)
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



# --------------------------------------------------------------------------- the causal phone reader


class StudentReader:
    """A ``rtanon train content`` checkpoint run offline on whole utterances, with its own lookahead: audio
    (T,) float32 -> ``z`` (floor(T / 320), 256) and, with a phone head (``--phone-weight``), its phone log
    probabilities (floor(T / 320), 191), frame ``t`` of each aligned with the input's frame ``t``."""

    def __init__(self, checkpoint: Path) -> None:
        import torch

        from rtanon.train.content import load_checkpoint
        from rtanon.train.teacher import PHONE_TOKENS

        ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
        self.model = load_checkpoint(checkpoint)
        self.head = None
        if ck.get("phone_head"):
            self.head = torch.nn.Linear(self.model.cfg.unit_dim, PHONE_TOKENS)
            self.head.load_state_dict(ck["phone_head"])

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        import torch

        la = self.model.cfg.lookahead_frames
        n = len(x) // FRAME_SAMPLES
        audio = np.concatenate([np.asarray(x, np.float32)[:n * FRAME_SAMPLES], np.zeros(la * FRAME_SAMPLES,
                                                                                         np.float32)])
        with torch.no_grad():
            state = self.model.init_state(1)
            logmel, _ = self.model.log_mel(torch.from_numpy(audio)[None], state[0])
            _, z, _ = self.model.encode_logmel(logmel, state[1:])
            z = z[:, la:la + n]
            lp = torch.log_softmax(self.head(z), -1)[0].numpy() if self.head is not None else None
        return z[0].numpy(), lp


class GraphPhoneReader:
    """A content encoder graph's ``z`` (run offline on whole utterances) read by a linear phone head fitted
    on the frozen ``z`` of training speech (``fit_phone_head``): the causal phone reader of an encoder
    trained without one, the same probe for every encoder. Audio (T,) -> (``z``, phone log probabilities),
    (floor(T / 320), D) and (floor(T / 320), 191)."""

    def __init__(self, probe: Path) -> None:
        import torch

        from rtanon.train.teacher import PHONE_TOKENS, graph_content

        ck = torch.load(probe, map_location="cpu", weights_only=True)
        self.z = graph_content(ck["content"])
        if self.z.sha256 != ck["content_sha256"]:
            raise SystemExit(f"{probe} was fitted on {ck['content_sha256'][:12]}, not on {ck['content']} "
                             f"({self.z.sha256[:12]})")
        self.mean, self.std = ck["mean"].numpy(), ck["std"].numpy()
        self.head = torch.nn.Linear(len(self.mean), PHONE_TOKENS)
        self.head.load_state_dict(ck["head"])

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        z = self.z(x)
        with torch.no_grad():
            lp = torch.log_softmax(self.head(torch.from_numpy((z - self.mean) / self.std)), -1).numpy()
        return z, lp


def fit_phone_head(graph: Path, caches: list[Path], out: Path, steps: int = 3000, batch: int = 8192,
                   seed: int = 0) -> dict:
    """Fits a linear head from a content graph's frozen, standardised ``z`` to hama's phones spread over
    their frames (``teacher.cached_phone_frames``: the phone-weight recipe's target) on cached training
    sets, cross-entropy, AdamW at 3e-3 with a cosine; writes ``out`` (what ``GraphPhoneReader`` reads) and
    returns the final training loss and frame accuracy."""
    import torch

    from rtanon import atomic
    from rtanon.neural.backends import file_sha256
    from rtanon.train.teacher import PHONE_TOKENS, CorpusCache, cached_graph_z, cached_phone_frames

    torch.manual_seed(seed)
    zs, ys = [], []
    for root in caches:
        cache = CorpusCache.load(root)
        zs.append(cached_graph_z(cache, graph).astype(np.float32))
        ys.append(cached_phone_frames(cache))
    z, y = np.concatenate(zs), np.concatenate(ys)
    mean, std = z.mean(0), z.std(0) + 1e-5
    z = torch.from_numpy((z - mean) / std)
    y = torch.from_numpy(y)
    head = torch.nn.Linear(z.shape[1], PHONE_TOKENS)
    opt = torch.optim.AdamW(head.parameters(), 3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        idx = torch.from_numpy(rng.integers(0, len(y), batch))
        loss = torch.nn.functional.cross_entropy(head(z[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        acc = float((head(z).argmax(-1) == y).float().mean())
        loss = float(torch.nn.functional.cross_entropy(head(z), y))
    with atomic.atomic_open(out) as f:
        torch.save({"content": str(graph), "content_sha256": file_sha256(graph), "head": head.state_dict(),
                    "mean": torch.from_numpy(mean), "std": torch.from_numpy(std), "steps": steps,
                    "cache": [str(c) for c in caches], "frames": len(y)}, f)
    return {"frames": len(y), "train_loss": loss, "train_frame_accuracy": acc}


def phone_reader(path: Path):
    """The reader a file names: a ``rtanon train content --phone-weight`` checkpoint (its own head) or a
    ``rtanon lab phone-eval --fit`` probe on a content graph."""
    import torch

    ck = torch.load(path, map_location="cpu", weights_only=False)
    return GraphPhoneReader(path) if "content_sha256" in ck else StudentReader(path)


def switching_decode(log_probs: np.ndarray, penalty: float) -> np.ndarray:
    """Frame log probabilities (T, K) -> the label sequence that maximises their sum minus ``penalty`` per
    change of label (Viterbi over K states, every change costing the same): a frame classifier's argmax
    flickers inside a phone, each flicker an inserted phone; 0 is the argmax."""
    t, k = log_probs.shape
    if t == 0:
        return np.zeros(0, np.int64)
    score = log_probs[0].astype(np.float64)
    back = np.zeros((t, k), np.int64)
    for i in range(1, t):
        best = int(score.argmax())
        switch = score[best] - penalty
        stay = score >= switch
        back[i] = np.where(stay, np.arange(k), best)
        score = np.where(stay, score, switch) + log_probs[i]
    path = np.empty(t, np.int64)
    path[-1] = int(score.argmax())
    for i in range(t - 1, 0, -1):
        path[i - 1] = back[i, path[i]]
    return path


def frame_phones_to_string(labels: np.ndarray, tokens: list[str]) -> list[str]:
    """Frame labels -> phones: runs collapsed, silence (the blank) and word boundaries dropped."""
    from rtanon.train.teacher import PHONE_BLANK, PHONE_WB

    keep = np.concatenate([[True], labels[1:] != labels[:-1]]) if len(labels) else np.zeros(0, bool)
    return [tokens[i] for i in labels[keep] if i not in (PHONE_BLANK, PHONE_WB)]


def phone_error_rates(checkpoint: Path, data_dirs: list[Path], per_speaker: int | None, seed: int = 0,
                      penalty: float = 0.0) -> dict:
    """The causal phone reader (a ``--phone-weight`` checkpoint's head on ``z``, or a linear head fitted on a
    content graph's frozen ``z``: ``fit_phone_head``) and hama (non-causal) on evaluation sets: PER of each
    against the transcripts' canonical phones (hama's G2P), of the reader against hama's own phones, and the
    reader's frame agreement with hama's phones spread over their frames (its training target)."""
    import hama

    from rtanon.io.audio import read_audio
    from rtanon.eval.metrics import error_counts
    from rtanon.eval.runner import _per_speaker
    from rtanon.eval.textnorm import normalize
    from rtanon.io.kaldi import KaldiDir
    from rtanon.train.teacher import hama_phone_posteriors, phone_frames

    reader = phone_reader(checkpoint)
    if reader.head is None:
        raise SystemExit(f"{checkpoint}: no phone head (train with --phone-weight)")
    posteriors = hama_phone_posteriors()
    teacher, g2p = hama.ASRModel(), hama.G2PModel()
    tokens = teacher.decoder_tokens
    out = {}
    for d in data_dirs:
        kd = _per_speaker(KaldiDir.load(d), per_speaker, seed)
        err = {"reader_vs_text": np.zeros(2), "hama_vs_text": np.zeros(2), "reader_vs_hama": np.zeros(2)}
        agree = np.zeros(2)
        utts = [u for u in sorted(kd.wav) if u in kd.text]
        for u in utts:
            x = read_audio(kd.wav[u])
            canonical = [a.phoneme for a in g2p.predict(" ".join(normalize(kd.text[u]))).alignments
                         if a.phoneme.strip()]
            heard = list(teacher.transcribe_waveform(x, 16000).phonemes)
            _, lp = reader(x)
            said = switching_decode(lp, penalty)
            target = phone_frames(posteriors(x))[:len(said)]
            agree += ((said[:len(target)] == target).sum(), len(target))
            hyp = frame_phones_to_string(said, tokens)
            for key, ref, h in (("reader_vs_text", canonical, hyp), ("hama_vs_text", canonical, heard),
                                ("reader_vs_hama", heard, hyp)):
                err[key] += (sum(error_counts(ref, h)), len(ref))
        out[Path(d).name] = {**{k: float(v[0] / max(1, v[1])) for k, v in err.items()},
                             "frame_agreement": float(agree[0] / max(1, agree[1])), "utterances": len(utts)}
    return out


def main_phone_eval(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=phone_error_rates.__doc__,
                                 epilog="A content graph without a phone head (version 4, the streaming Whisper "
                                        "encoder, its zero-shot export) gets one first: --fit GRAPH --cache "
                                        "runs/cache/so762_train runs/cache/libri_clips writes the head to CHECKPOINT "
                                        "(caches with phones.npy: `rtanon lab envelope-probe features`), then reads.")
    ap.add_argument("checkpoint", type=Path, help="a rtanon train content --phone-weight checkpoint (ckpt.pt), or the "
                                                  "head file --fit writes and reads")
    ap.add_argument("--data", nargs="+", type=Path, metavar="KALDI_DIR", default=[],
                    help="evaluation sets with transcripts (so762_dev, libri_devclean)")
    ap.add_argument("--fit", type=Path, default=None, metavar="GRAPH",
                    help="fit a linear phone head on this content graph's frozen z first (training caches: --cache)")
    ap.add_argument("--cache", nargs="+", type=Path, default=[], metavar="CACHE",
                    help="cached training sets for --fit (never an evaluation set)")
    ap.add_argument("--utts-per-speaker", type=int, default=4, help="utterances per speaker, seeded (default 4)")
    ap.add_argument("--penalty", type=float, default=0.0,
                    help="log-probability cost of each change of phone in the decoding (switching_decode; choose it "
                         "on training speech, default 0: the frame argmax)")
    args = ap.parse_args(argv)
    if args.fit is None and not args.data:
        ap.error("nothing to do: pass --data KALDI_DIR ... to read, --fit GRAPH --cache ... to fit a head, or both")
    if args.fit is not None:
        from rtanon.train.shards import looks_like_eval_dir

        if not args.cache:
            ap.error("--fit needs --cache (cached training sets)")
        if any(looks_like_eval_dir(c.resolve().name) for c in args.cache):
            ap.error("--cache holds an evaluation set: never fit on it")
        print(json.dumps(fit_phone_head(args.fit, args.cache, args.checkpoint)), flush=True)
    if args.data:
        print(json.dumps(phone_error_rates(args.checkpoint, args.data, args.utts_per_speaker,
                                           penalty=args.penalty), indent=1))
    return 0
