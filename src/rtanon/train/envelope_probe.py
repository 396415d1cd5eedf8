"""Envelope probes: how much of the spectral envelope can each content representation give?

The budget (``rtanon lab budget``) shows the synthesiser keeps the words when its envelopes are measured
from the input, so the loss lies in predicting them from content. This probe fits the same small causal
regressor from each of four representations to the envelopes WORLD measures (harmonic and noise, 48
mel-spaced points per 10 ms, the synthesiser's own grid), conditioned on the utterance's own resemblyzer
embedding:

- ``whisper``: the Whisper tiny.en encoder (the content encoder's teacher; offline, non-causal);
- ``phones``: hama's phone log-posteriors (191 IPA tokens at 50 Hz; the phonetic teacher, non-causal);
- ``z``: content encoder version 4's ``z`` (what the strong vocoder reads);
- ``mel``: the input's own 80-band log-mel per 20 ms (:func:`rtanon.neural.input_mel.log_mel_frames`): the
  control, how close the regressor and the synthesiser get when the content holds the spectrum itself;
- ``graph``: any content encoder graph's ``z`` (``--content GRAPH``: version 4, the streaming Whisper
  encoder, its zero-shot export), run offline on each utterance; computed on the first ``train`` into
  ``content_graph_SHA.npy`` beside the cache;
- ``utterance``, ``utterancebase``, ``moonshine``: the whole-utterance candidates of files and corpora
  (issue 62), each encoder over one utterance alone with a second of silence after it: Whisper tiny.en
  (the shipped path's content), Whisper base, Moonshine base (``pip install '.[moonshine]'``); computed
  on the first ``train`` into ``content_KIND.npy`` beside the cache.

The budget renders the fitted regressors' envelopes through the synthesiser (rows ``probe_*``), so the
four differ in their input only: the gap between ``whisper``/``phones`` and ``z`` is what a better causal
student could win, the gap between them and ``mel`` what the teacher itself lacks, and the gap between
``mel`` and ``synth_own`` what the regressor loses.

    rtanon lab envelope-probe features --data ../shared/data/so762_train --cache runs/cache
    rtanon lab envelope-probe train --cache runs/cache/so762_train --input phones --out runs/envprobe_phones.pt

``features`` reuses the content encoder's cache (audio and Whisper features, ``rtanon.train.teacher``), adds
hama's phone posteriors to it (``phone_posteriors``) and ``envprobe.npz`` beside it; ``train`` fits on the
cached training sets only (never an evaluation set).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rtanon import atomic

INPUTS = {"whisper": 384, "phones": 191, "phoneframes": 191, "z": 256, "mel": 80, "student": 256,
          "studentphones": 191, "utterance": 384, "utterancebase": 512, "moonshine": 416, "graph": None}
#: whole-utterance candidates of the file and corpus path (issue 62), each read on one utterance alone as
#: :func:`rtanon.content.utterance.encode_utterance` does: Whisper tiny.en (the shipped path's content),
#: Whisper base, Moonshine base's encoder; computed once per cached set into ``content_KIND.npy``
UTTERANCE_INPUTS = ("utterance", "utterancebase", "moonshine")
MOONSHINE_HOP = 384  # samples per frame of Moonshine's encoder (41.7 Hz)
#: inputs read from a content checkpoint (``--student``) instead of the shipped encoder or a teacher
STUDENT_INPUTS = ("student", "studentphones")
#: the input read from a content encoder graph (``--content``); its width is the graph's
GRAPH_INPUT = "graph"
POINTS = 48  # envelope points per 10 ms: VocoderConfig.envelope_points of the shipped vocoders
LOG_FLOOR = -9.0  # log amplitude floor of the targets (about -78 dB)


# --------------------------------------------------------------------------- envelopes measured from the input


def measured_envelopes(x: np.ndarray, f0_hz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """WORLD analysis of ``x`` (16 kHz) at rtanon's F0 track (one value per 10 ms frame) -> the periodic
    and aperiodic power envelopes, (F, 513) each, on 1024-point FFT bins: ``sp * (1 - ap)``, ``sp * ap``."""
    import pyworld

    from rtanon.constants import HOP_SAMPLES, SAMPLE_RATE_HZ

    x64 = np.asarray(x, np.float64)
    t = (np.arange(len(f0_hz)) * HOP_SAMPLES + HOP_SAMPLES / 2) / SAMPLE_RATE_HZ
    f0 = np.asarray(f0_hz, np.float64)
    sp = pyworld.cheaptrick(x64, f0, t, SAMPLE_RATE_HZ, fft_size=1024)
    ap = pyworld.d4c(x64, f0, t, SAMPLE_RATE_HZ, fft_size=1024)
    return sp * (1.0 - ap), sp * ap


def envelope_points(power: np.ndarray, points: int, warp: float = 1.0) -> np.ndarray:
    """(F, 513) power envelope -> (points, F) log amplitudes at ``points`` mel-spaced frequencies 0-8 kHz
    (the synthesiser's grid); ``warp`` > 1 moves the formants up by that factor (reads the envelope at
    f / warp)."""
    from rtanon.neural.vocoder import _hz_to_mel

    nyq = 8000.0
    mel = np.linspace(0.0, _hz_to_mel(nyq), points)
    hz = 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    bins = np.linspace(0.0, nyq, power.shape[1])
    src = np.clip(hz / warp, 0.0, nyq)
    amp = np.sqrt(np.maximum(power, 1e-16))
    return np.log(np.stack([np.interp(src, bins, a) for a in amp], axis=1)).astype(np.float32)


def synthesise(f0_hz: np.ndarray, harm: np.ndarray, noise: np.ndarray, seed: int, warp: float = 1.0) -> np.ndarray:
    """The vocoder's envelope synthesiser on measured envelopes: ``harm``/``noise`` (F, 513) power, F0 in
    Hz per 10 ms frame -> audio (160 F,)."""
    return synthesise_points(f0_hz, envelope_points(harm, POINTS, warp), envelope_points(noise, POINTS, warp), seed)


def synthesise_points(f0_hz: np.ndarray, env_h: np.ndarray, env_n: np.ndarray, seed: int) -> np.ndarray:
    """The synthesiser on log-amplitude envelope points (48, F) of the periodic and aperiodic power
    envelopes. A harmonic of a pulse train with power envelope ``S`` at F0 has amplitude
    ``2 sqrt(F0 / fs) sqrt(S)`` (WORLD's CheapTrick scaling, checked on synthetic harmonics), and white
    noise of power ``S`` per bin has standard deviation ``sqrt(S)``."""
    import torch

    from rtanon.constants import HOP_SAMPLES, SAMPLE_RATE_HZ
    from rtanon.neural.vocoder import EnvelopeSynth, VocoderConfig, _Slots

    cfg = VocoderConfig()
    slots = _Slots()
    synth = EnvelopeSynth(slots, cfg)
    n = min(len(f0_hz), env_h.shape[1], env_n.shape[1])
    f0 = np.asarray(f0_hz[:n], np.float32)
    env_h = (env_h[:, :n] + np.log(2.0 * np.sqrt(np.maximum(f0, 1.0) / SAMPLE_RATE_HZ))[None, :]).astype(np.float32)
    env_n = np.ascontiguousarray(env_n[:, :n], dtype=np.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        state = [torch.zeros(1, c, k) for c, k in slots.shapes]
        y = synth(torch.from_numpy(f0[None]), torch.from_numpy(env_h[None]), torch.from_numpy(env_n[None]),
                  torch.randn(1, HOP_SAMPLES * n, generator=gen), state, [None] * len(state))
    return y[0, 0].numpy()


# --------------------------------------------------------------------------- features


def _content(kind: str, student: str | None = None):
    """Per-process content extractors: audio (T,) float32 16 kHz -> (floor(T / 320), D) float32; the
    ``STUDENT_INPUTS`` read the content checkpoint ``student`` (its ``z`` or its phone log probabilities),
    ``graph`` the content encoder graph ``student``."""
    if kind == GRAPH_INPUT:
        from rtanon.train.teacher import graph_content

        return graph_content(student)
    if kind in STUDENT_INPUTS:
        from rtanon.train.content_eval import StudentReader

        reader = StudentReader(Path(student))
        return lambda x: reader(x)[0 if kind == "student" else 1]
    if kind == "whisper":
        from rtanon.train.teacher import TEACHER_DIM, WINDOW_SAMPLES, need_module, teacher_model_path

        ct2 = need_module("ctranslate2")
        fw = need_module("faster_whisper.feature_extractor")
        fe = fw.FeatureExtractor(feature_size=80)
        model = ct2.models.Whisper(str(teacher_model_path()), device="cpu", compute_type="float32", intra_threads=1)

        def whisper(x: np.ndarray) -> np.ndarray:
            n = len(x) // 320
            out = np.zeros((n, TEACHER_DIM), np.float32)
            for s in range(0, len(x), WINDOW_SAMPLES):  # 30 s windows, each on the 320-sample grid
                buf = np.zeros(WINDOW_SAMPLES, np.float32)
                seg = x[s:s + WINDOW_SAMPLES]
                buf[:len(seg)] = seg
                feats = fe(buf, padding=0)[:, :3000]
                enc = np.asarray(model.encode(ct2.StorageView.from_array(np.ascontiguousarray(feats[None]))))[0]
                k = s // 320
                m = min(n - k, 1500)
                out[k:k + m] = enc[:m]
            return out
        return whisper
    if kind in ("utterance", "utterancebase"):
        from rtanon.train.whisper import UtteranceContent

        return UtteranceContent("tiny.en" if kind == "utterance" else "base").encode
    if kind == "moonshine":
        return _moonshine()
    if kind == "phones":
        from rtanon.train.teacher import hama_phone_posteriors

        return hama_phone_posteriors()
    if kind == "phoneframes":
        from rtanon.train.teacher import hama_phone_posteriors, phone_frames

        phones = hama_phone_posteriors()
        return lambda x: _one_hot(phone_frames(phones(x)))
    if kind == "mel":
        from rtanon.neural.input_mel import log_mel_frames

        return lambda x: log_mel_frames(np.asarray(x, np.float32), INPUTS["mel"])
    if kind == "z":
        from rtanon.train.teacher import graph_content

        return graph_content(None)
    raise KeyError(kind)


def to_content_rate(frames: np.ndarray, hop: int, n: int) -> np.ndarray:
    """(K, D) frames of ``hop`` samples each -> (n, D) at the content rate (320 samples), each output frame
    read at its centre by linear interpolation between the input frames' centres (ends held)."""
    from rtanon.constants import FRAME_SAMPLES

    src = (np.arange(len(frames)) + 0.5) * hop
    dst = (np.arange(n) + 0.5) * FRAME_SAMPLES
    return np.stack([np.interp(dst, src, frames[:, d]) for d in range(frames.shape[1])], axis=1).astype(np.float32)


def _moonshine():
    """Moonshine base's encoder (MIT; ``models/base-en/encoder_model.ort`` of the ``moonshine-cpp==0.1.4``
    wheel, read with ONNX Runtime: importing ``moonshine_cpp`` itself needs AVX-512) on each utterance
    alone, its 41.7 Hz frames brought to 50 Hz."""
    import importlib.util

    import onnxruntime as ort

    from rtanon.constants import FRAME_SAMPLES
    from rtanon.content.utterance import encode_utterance

    spec = importlib.util.find_spec("moonshine_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--input moonshine needs the moonshine-cpp wheel: pip install '.[moonshine]'")
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "base-en" / "encoder_model.ort"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def run(x: np.ndarray) -> np.ndarray:
        h = session.run(None, {"input_values": np.asarray(x, np.float32)[None]})[0][0]
        return to_content_rate(h, MOONSHINE_HOP, len(x) // FRAME_SAMPLES)
    return lambda x: encode_utterance(np.asarray(x, np.float32), run)


def _computed_content(cache, kind: str) -> np.ndarray:
    """A whole-utterance candidate's frames of every cached utterance, computed once into
    ``content_KIND.npy`` beside the cache (float16)."""
    from rtanon.train.teacher import computed_frames

    return computed_frames(cache, cache.root / f"content_{kind}.npy", _content(kind), INPUTS[kind], kind)


def _one_hot(labels: np.ndarray) -> np.ndarray:
    return np.eye(INPUTS["phoneframes"], dtype=np.float32)[labels]


def target_envelopes(x: np.ndarray, f0: np.ndarray) -> np.ndarray:
    """(2T, 96) float32 log amplitudes: harmonic then noise envelope points (no F0 scaling)."""
    harm, noise = measured_envelopes(x, f0)
    env = np.concatenate([envelope_points(harm, POINTS), envelope_points(noise, POINTS)]).T
    return np.maximum(env, LOG_FLOOR).astype(np.float32)


def features(args) -> None:
    from tqdm import tqdm

    from rtanon.train.shards import default_extractors
    from rtanon.train.teacher import build_cache, phone_posteriors

    cache = build_cache(Path(args.data), Path(args.cache), threads=1)
    phone_posteriors(cache)
    out = cache.root / "envprobe.npz"
    extract = default_extractors()
    audio = cache.audio()
    z = _content("z")
    env, f0s, zs, emb = [], [], [], []
    for i in tqdm(range(len(cache.utts)), desc=cache.root.name, unit="utt", file=sys.stderr):
        x = audio[cache.audio_offset[i]:cache.audio_offset[i] + cache.audio_len[i]].astype(np.float32) / 32767.0
        t = int(cache.frame_len[i])
        f0 = extract.f0_hz(x)[:2 * t]
        f0 = np.pad(f0, (0, 2 * t - len(f0)))
        env.append(target_envelopes(x, f0).astype(np.float16))
        f0s.append(f0.astype(np.float32))
        zs.append(z(x)[:t].astype(np.float16))
        emb.append(extract.speaker_embedding([x]).astype(np.float32))
    with atomic.atomic_open(out) as f:
        np.savez(f, env=np.concatenate(env), f0=np.concatenate(f0s), z=np.concatenate(zs), emb=np.stack(emb))
    print(f"{out}: {len(cache.utts)} utterances, {int(cache.frame_len.sum())} frames")


# --------------------------------------------------------------------------- the regressor


class EnvelopeRegressor(nn.Module):
    """Causal: content (B, T, D) at 50 Hz + speaker (B, 256) -> log envelopes (B, 2T, 96) at 100 Hz."""

    def __init__(self, in_dim: int, channels: int = 256, dilations: tuple[int, ...] = (1, 2, 4, 8, 1, 1)) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(in_dim)
        self.inp = nn.Conv1d(in_dim, channels, 3)
        self.spk = nn.Linear(256, channels)
        self.dilations = dilations
        self.layers = nn.ModuleList(nn.Conv1d(channels, channels, 3, dilation=d) for d in dilations)
        self.out = nn.Conv1d(channels, 4 * POINTS, 1)

    def forward(self, content: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
        x = self.norm(content).transpose(1, 2)
        x = self.inp(F.pad(x, (2, 0))) + self.spk(speaker)[:, :, None]
        for layer, d in zip(self.layers, self.dilations):
            x = x + layer(F.pad(F.leaky_relu(x, 0.1), (2 * d, 0)))
        y = self.out(F.leaky_relu(x, 0.1))  # (B, 2 * 96, T)
        b, _, t = y.shape
        return y.reshape(b, 2, 2 * POINTS, t).permute(0, 3, 1, 2).reshape(b, 2 * t, 2 * POINTS)


def _cached_mel(cache) -> np.ndarray:
    """The input log-mel of every cached frame (computed on load: a few seconds an hour)."""
    mel = _content("mel")
    audio = cache.audio()
    return np.concatenate([mel(audio[o:o + n].astype(np.float32) / 32767.0)[:t] for o, n, t in
                           zip(cache.audio_offset, cache.audio_len, cache.frame_len)])


def _student_content(cache, kind: str, student: str) -> np.ndarray:
    """A content checkpoint's output on every cached utterance (computed on load)."""
    extract = _content(kind, student)
    audio = cache.audio()
    return np.concatenate([extract(audio[o:o + n].astype(np.float32) / 32767.0)[:t] for o, n, t in
                           zip(cache.audio_offset, cache.audio_len, cache.frame_len)])


class _Data:
    def __init__(self, roots: list[Path], kind: str, student: str | None = None) -> None:
        from rtanon.train.teacher import CorpusCache, cached_graph_z, cached_phone_frames

        self.items = []
        for root in roots:
            cache = CorpusCache.load(root)
            with np.load(root / "envprobe.npz") as npz:  # each key read once (a key access reads it whole)
                env, f0, emb = npz["env"], npz["f0"], npz["emb"]
                content = {"whisper": lambda: cache.teacher(mmap=False), "phones": lambda: np.load(root / "phones.npy"),
                           "phoneframes": lambda: _one_hot(cached_phone_frames(cache)).astype(np.float16),
                           "student": lambda: _student_content(cache, kind, student),
                           "studentphones": lambda: _student_content(cache, kind, student),
                           "z": lambda: npz["z"], "mel": lambda: _cached_mel(cache),
                           GRAPH_INPUT: lambda: cached_graph_z(cache, student),
                           **{k: (lambda k=k: _computed_content(cache, k)) for k in UTTERANCE_INPUTS}}[kind]()
            for i in range(len(cache.utts)):
                o, t = int(cache.frame_offset[i]), int(cache.frame_len[i])
                if t >= 20:
                    self.items.append((content[o:o + t], env[2 * o:2 * o + 2 * t], f0[2 * o:2 * o + 2 * t], emb[i]))

    def batch(self, rng: np.random.Generator, size: int, frames: int):
        c, e, v, s = [], [], [], []
        for k in rng.integers(0, len(self.items), size):
            content, env, f0, emb = self.items[k]
            t = len(content)
            start = int(rng.integers(0, max(1, t - frames + 1)))
            n = min(frames, t)
            cc = np.zeros((frames, content.shape[1]), np.float32)
            cc[:n] = content[start:start + n]
            ee = np.full((2 * frames, 2 * POINTS), LOG_FLOOR, np.float32)
            ee[:2 * n] = env[2 * start:2 * start + 2 * n]
            vv = np.zeros(2 * frames, np.float32)
            vv[:2 * n] = f0[2 * start:2 * start + 2 * n] > 0
            c.append(cc), e.append(ee), v.append(vv), s.append(emb)
        return (torch.from_numpy(np.stack(c)), torch.from_numpy(np.stack(s)), torch.from_numpy(np.stack(e)),
                torch.from_numpy(np.stack(v)))


def envelope_loss(pred: torch.Tensor, target: torch.Tensor, voiced: torch.Tensor) -> torch.Tensor:
    """L1 on log amplitudes: the noise envelope everywhere, the harmonic one where voiced."""
    err = (pred - target).abs()
    harm = (err[..., :POINTS].mean(-1) * voiced).sum() / voiced.sum().clamp(min=1.0)
    return harm + err[..., POINTS:].mean()


def train(args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if (args.input in STUDENT_INPUTS) != (args.student is not None):
        raise SystemExit(f"--student CKPT goes with --input {' or '.join(STUDENT_INPUTS)} (and only with them)")
    if (args.input == GRAPH_INPUT) != (args.content is not None):
        raise SystemExit(f"--content GRAPH goes with --input {GRAPH_INPUT} (and only with it)")
    source = args.student or args.content
    data = _Data([Path(c) for c in args.cache], args.input, source)
    in_dim = data.items[0][0].shape[1]
    net = EnvelopeRegressor(in_dim)
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=args.steps, pct_start=0.05)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for step in range(args.steps):
        c, s, e, v = data.batch(rng, 16, 100)
        loss = envelope_loss(net(c, s), e, v)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 250 == 0 or step == args.steps - 1:
            print(f"{args.input} step {step}: L1 {float(loss.detach()):.3f} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    with atomic.atomic_open(args.out) as f:
        torch.save({"input": args.input, "state": net.state_dict(), "steps": args.steps, "student": source,
                    "in_dim": in_dim, "seed": args.seed, "cache": [str(c) for c in args.cache]}, f)
    print(f"wrote {args.out}")


def load(path: str | Path) -> tuple[str, EnvelopeRegressor, str | None]:
    """-> the probe's input, its regressor and the content checkpoint (``STUDENT_INPUTS``) or graph
    (``graph``) it read."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    net = EnvelopeRegressor(ckpt.get("in_dim") or INPUTS[ckpt["input"]])
    net.load_state_dict(ckpt["state"])
    return ckpt["input"], net.eval(), ckpt.get("student")


def predict(net: EnvelopeRegressor, content: np.ndarray, speaker: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> harmonic and noise log-amplitude points, (48, 2T) each (no F0 scaling)."""
    with torch.no_grad():
        y = net(torch.from_numpy(content[None].astype(np.float32)),
                torch.from_numpy(np.asarray(speaker, np.float32)[None]))[0].numpy()
    return y[:, :POINTS].T, y[:, POINTS:].T


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("features", help="envelopes, F0, phone posteriors, z and speaker embeddings of a training set")
    p.add_argument("--data", required=True, help="a training Kaldi dir (never an evaluation set)")
    p.add_argument("--cache", required=True, help="the content encoder's cache root (e.g. runs/cache)")
    p.set_defaults(func=features)
    p = sub.add_parser("train", help="fit the regressor from one content representation")
    p.add_argument("--cache", nargs="+", required=True, help="cached training sets (runs/cache/NAME)")
    p.add_argument("--input", required=True, choices=list(INPUTS))
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the initial weights and the crops (default 0); another seed measures the probe's own "
                        "spread")
    p.add_argument("--student", default=None, metavar="CKPT",
                   help=f"the content checkpoint the {' and '.join(STUDENT_INPUTS)} inputs read")
    p.add_argument("--content", default=None, metavar="GRAPH",
                   help=f"the content encoder graph the {GRAPH_INPUT} input reads (its z, offline; e.g. "
                        "`rtanon lab export-whisper` without --checkpoint: the zero-shot Whisper encoder)")
    p.set_defaults(func=train)
    args = ap.parse_args(argv)
    from rtanon.train.shards import looks_like_eval_dir

    if args.cmd == "features" and looks_like_eval_dir(Path(args.data).resolve().name):
        raise SystemExit(f"{args.data} is an evaluation set: never fit on it")
    args.func(args)
