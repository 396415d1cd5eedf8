"""Training recipe for the causal content encoder (``rtanon train content``).

Steps, each resumable (finished work is found on disk and skipped):

1. For every ``--data`` Kaldi directory, cache the audio (int16) and the
   Whisper tiny.en teacher features (float16) under ``<cache>/<name>/``.
2. K-means (K = ``n_units``) on standardised teacher frames of all training
   directories; every frame gets its discrete unit (``units_K<K>.npy``).
3. Train ``ContentEncoder`` with cross-entropy between paper 002 Eq. 1 soft
   units and the teacher's units, on random crops (state starts at zero as in
   a fresh stream), with speaker-variety augmentation that keeps the time
   alignment: vocal-tract-length perturbation of the mel filterbank, random
   gain and a little white noise, and speed perturbation (the crop resampled,
   its targets stretched with it); optionally SpecAugment masks on the
   log-mel. With ``teacher_weight`` > 0 a linear head on the projection z
   also regresses the standardised teacher features (L1), so z keeps more of
   the teacher's phonetic detail than the K units alone;
   the head is training-only (saved in the checkpoint, never exported).
   With ``speaker_adversary`` > 0 a small convolutional classifier reads z
   frame by frame (180 ms of context) through a gradient reversal (Ganin and
   Lempitsky 2015) and learns each crop's training speaker on its speech
   frames; z learns to hide them (training-only as well).
   ``init`` warm-starts the network (and the heads it has) from an earlier
   checkpoint. Checkpoints (``ckpt.pt``) every ``checkpoint_every_s`` and at
   the end; a rerun resumes from it. Seeds are fixed; the log goes to ``<out>/train.log``.

Never pass the evaluation directory (so762_dev) as ``--data``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from rtanon.atomic import atomic_open
from rtanon.constants import FRAME_SAMPLES
from rtanon.train.teacher import (PHONE_TOKENS, TEACHER_DIM, CorpusCache, assign_units, build_cache,
                                  cached_phone_frames, fit_units)
from rtanon.neural.input_mel import mel_filterbank
from rtanon.content.config import ContentModelConfig
from rtanon.train.shards import looks_like_eval_dir

log = logging.getLogger("rtanon.train.content")


@dataclass
class TrainConfig:
    """Training settings; ``validate()`` says how to fix a bad value."""

    data_dirs: list[Path]
    out_dir: Path
    cache_dir: Path | None = None  # default: <out_dir>/cache
    model: ContentModelConfig = field(default_factory=ContentModelConfig)
    seed: int = 0
    batch_size: int = 12
    crop_frames: int = 150  # 3 s of 50 Hz frames
    lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 200
    max_steps: int = 2400
    max_minutes: float = 90.0  # stop (with a checkpoint) after this much training time in this run
    checkpoint_every_s: float = 180.0
    threads: int = 1  # 1 is fastest on a shared machine
    vtlp_range: tuple[float, float] = (0.85, 1.18)
    gain_db_range: tuple[float, float] = (-12.0, 6.0)
    speed_factors: tuple[float, ...] = (0.9, 1.1)  # speed perturbation (1.0 is always possible too)
    speed_prob: float = 0.0  # share of crops speed-perturbed
    teacher_weight: float = 0.0  # weight of the L1 regression of the teacher features from z
    # weight of the cross-entropy of a linear phone head on z against hama's phones spread over their frames
    # (``teacher.phone_frames``; cached posteriors in <cache>/<name>/phones.npy): the causal phone reader
    phone_weight: float = 0.0
    # SpecAugment (Park et al. 2019) on the normalised log-mel of every crop, targets unchanged: this many
    # frequency masks of up to freq_mask_max bands and time masks of up to time_mask_max 10 ms frames
    freq_masks: int = 0
    time_masks: int = 0
    freq_mask_max: int = 10
    time_mask_max: int = 10
    init: Path | None = None  # warm start: network weights from this checkpoint (not its optimiser)
    speaker_adversary: float = 0.0  # weight of the frame-level speaker classifier on z behind gradient reversal
    # fine-tune Whisper's own encoder in its streaming form instead (``rtanon.train.whisper_tune``): the
    # model's name, and the frames each frame attends to
    whisper: str | None = None
    window_frames: int = 100

    def validate(self) -> None:
        if not self.data_dirs:
            raise ValueError("no training data: pass --data DIR [DIR ...] (Kaldi-style directories)")
        for d in self.data_dirs:
            if not (Path(d) / "wav.scp").exists():
                raise ValueError(f"{d}: not a Kaldi-style directory (no wav.scp)")
            if looks_like_eval_dir(Path(d).resolve().name):
                raise ValueError(f"{d}: looks like an evaluation split (so762_dev and libri_devclean are "
                                 "evaluation only); train on so762_train and libri_clips")
        if self.batch_size < 1 or self.crop_frames < 10:
            raise ValueError("batch_size must be >= 1 and crop_frames >= 10")
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if not 0.0 <= self.speed_prob <= 1.0 or any(not 0.7 <= f <= 1.3 for f in self.speed_factors):
            raise ValueError("speed_prob must be in [0, 1] and every speed factor in [0.7, 1.3]")
        if min(self.freq_masks, self.time_masks) < 0 or not 1 <= self.freq_mask_max <= self.model.n_mels // 2 \
                or not 1 <= self.time_mask_max <= self.crop_frames:
            raise ValueError("freq_masks/time_masks must be >= 0, freq_mask_max 1..n_mels/2 and time_mask_max "
                             "1..crop_frames (10 ms frames)")
        if self.teacher_weight < 0 or self.phone_weight < 0 or self.speaker_adversary < 0:
            raise ValueError("teacher_weight, phone_weight and speaker_adversary must be >= 0 (0 = off)")
        if not 0.0 <= self.lr <= 1.0:
            raise ValueError("the learning rate must be in [0, 1] (default 2e-3)")
        if self.whisper not in (None, "tiny.en") or not 1 <= self.window_frames <= 1500:
            raise ValueError(f"whisper={self.whisper!r}, window_frames={self.window_frames}: use --whisper tiny.en "
                             "(the teacher's frames and units are tiny.en's) and a window of 1..1500 frames of 20 ms")
        if self.init is not None and not Path(self.init).exists():
            raise ValueError(f"--init {self.init}: no such checkpoint")
        self.model.validate()

    @property
    def cache(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path(self.out_dir) / "cache"


def _speed_ratio(factor: float) -> tuple[int, int]:
    """(up, down) for ``resample_poly``: output length = input * up / down = input / factor."""
    from fractions import Fraction

    r = Fraction(1.0 / factor).limit_denominator(20)
    return r.numerator, r.denominator


class _Batches:
    """Random aligned crops: audio (B, n*320) float32, units (B, n) int64 (-100 = padding),
    VTLP filterbanks (B, n_mels, 257), with ``teacher_weight`` > 0 standardised teacher
    features (B, n, 384) float32, with ``phone_weight`` > 0 frame phone labels (B, n) int64
    (-100 = padding), and each crop's speaker index (B,) int64 (speakers are per corpus).

    Speed perturbation by factor f reads about ``n * f`` frames of the source, resamples
    their audio to ``n`` frames' length (pitch and formants move with it) and takes every
    target from the source frame under the centre of its output frame."""

    def __init__(self, caches: list[CorpusCache], k: int, cfg: TrainConfig, rng: np.random.Generator,
                 teacher_norm: tuple[np.ndarray, np.ndarray] | None = None):
        self.cfg, self.rng = cfg, rng
        self.items = []  # (cache index, utt index)
        self.audio = [c.audio(mmap=False) for c in caches]
        self.units = [c.units(k) for c in caches]
        self.teacher = [c.teacher(mmap=True) for c in caches] if teacher_norm is not None else None
        self.teacher_norm = teacher_norm
        self.phones = [cached_phone_frames(c) for c in caches] if cfg.phone_weight else None
        self.caches = caches
        names = sorted({(ci, spk) for ci, c in enumerate(caches) for spk in c.spk})
        self.speaker_index = {name: i for i, name in enumerate(names)}
        weights = []
        for ci, c in enumerate(caches):
            for ui in range(len(c.utts)):
                if c.frame_len[ui] >= 5:
                    self.items.append((ci, ui))
                    weights.append(min(int(c.frame_len[ui]), cfg.crop_frames))
        w = np.asarray(weights, dtype=np.float64)
        self.p = w / w.sum()
        lo, hi = cfg.vtlp_range
        self.warps = np.linspace(lo, hi, 15)
        self.fbs = np.stack([mel_filterbank(cfg.model.n_mels, warp=a) for a in self.warps])

    def __call__(self):
        from scipy.signal import resample_poly

        cfg, rng = self.cfg, self.rng
        B, n = cfg.batch_size, cfg.crop_frames
        audio = np.zeros((B, n * FRAME_SAMPLES), dtype=np.float32)
        units = np.full((B, n), -100, dtype=np.int64)
        teacher = np.zeros((B, n, self.teacher[0].shape[1]), dtype=np.float32) if self.teacher else None
        phones = np.full((B, n), -100, dtype=np.int64) if self.phones else None
        fb_idx = np.zeros(B, dtype=np.int64)
        speakers = np.zeros(B, dtype=np.int64)
        for b, j in enumerate(rng.choice(len(self.items), size=B, p=self.p)):
            ci, ui = self.items[j]
            c = self.caches[ci]
            speakers[b] = self.speaker_index[(ci, c.spk[ui])]
            nf = int(c.frame_len[ui])
            factor = self.speed_factor()
            up, down = _speed_ratio(factor)
            n_src = min(nf, int(np.ceil(n * down / up)))  # source frames that fill at most n output frames
            s = int(rng.integers(0, nf - n_src + 1))
            a0 = int(c.audio_offset[ui]) + s * FRAME_SAMPLES
            x = self.audio[ci][a0:a0 + n_src * FRAME_SAMPLES].astype(np.float32) / 32767.0
            if factor != 1.0:
                x = resample_poly(x, up, down).astype(np.float32)
            m = min(n, len(x) // FRAME_SAMPLES)
            x = x[:m * FRAME_SAMPLES]
            # the source frame under the centre of each output frame
            src = np.minimum(((2 * np.arange(m) + 1) * down) // (2 * up), n_src - 1) + int(c.frame_offset[ui]) + s
            audio[b, :len(x)] = self.gain_and_noise(x)
            units[b, :m] = self.units[ci][src]
            if teacher is not None:
                mean, std = self.teacher_norm
                teacher[b, :m] = (np.asarray(self.teacher[ci][src], dtype=np.float32) - mean) / std
            if phones is not None:
                phones[b, :m] = self.phones[ci][src]
            fb_idx[b] = self.pick_warp()
        return audio, units, self.fbs[fb_idx], teacher, phones, speakers

    def speed_factor(self) -> float:
        if self.cfg.speed_prob > 0 and self.rng.random() < self.cfg.speed_prob:
            return float(self.rng.choice(self.cfg.speed_factors))
        return 1.0

    def gain_and_noise(self, x: np.ndarray) -> np.ndarray:
        """A random gain and, on 30 % of crops, white noise at -70..-45 dBFS; clipped to [-1, 1]."""
        rng = self.rng
        x = x * 10.0 ** (rng.uniform(*self.cfg.gain_db_range) / 20.0)
        if rng.random() < 0.3:
            x = x + rng.standard_normal(len(x)).astype(np.float32) * 10.0 ** (rng.uniform(-70, -45) / 20.0)
        return np.clip(x, -1.0, 1.0)

    def pick_warp(self) -> int:
        """Index of a VTLP filterbank: a random warp on 80 % of crops, otherwise none."""
        if self.rng.random() < 0.8:
            return int(self.rng.integers(len(self.warps)))
        return int(np.argmin(abs(self.warps - 1.0)))


def spec_augment(logmel, rng: np.random.Generator, freq_masks: int, time_masks: int, freq_max: int, time_max: int):
    """SpecAugment's masks on a normalised log-mel batch (B, n_mels, T; numpy or torch), in place: per item
    ``freq_masks`` bands of width 0..``freq_max`` and ``time_masks`` spans of 0..``time_max`` frames set
    to 0, the features' mean (the input normalisation makes it 0). Returns ``logmel``."""
    b, n_mels, t = logmel.shape
    for i in range(b):
        for _ in range(freq_masks):
            w = int(rng.integers(0, freq_max + 1))
            f0 = int(rng.integers(0, n_mels - w + 1))
            logmel[i, f0:f0 + w, :] = 0.0
        for _ in range(time_masks):
            w = int(rng.integers(0, min(time_max, t) + 1))
            t0 = int(rng.integers(0, t - w + 1))
            logmel[i, :, t0:t0 + w] = 0.0
    return logmel


def _feature_stats(model, caches: list[CorpusCache], rng: np.random.Generator):
    import torch

    xs = []
    for c in caches:
        a = c.audio(mmap=True)
        for ui in rng.choice(len(c.utts), size=min(100, len(c.utts)), replace=False):
            o, n = int(c.audio_offset[ui]), int(c.frame_len[ui]) * FRAME_SAMPLES
            xs.append(np.asarray(a[o:o + n], dtype=np.float32) / 32767.0)
    with torch.no_grad():
        feats = [model.log_mel(torch.from_numpy(x)[None], torch.zeros(1, 240))[0][0] for x in xs if len(x)]
    f = torch.cat(feats, dim=1)
    return f.mean(1), f.std(1) + 1e-3


def _setup_logging(out: Path) -> None:
    """Log to ``<out>/train.log`` and stderr (replacing a handler of an earlier run in this process)."""
    out.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    root = logging.getLogger("rtanon")
    root.setLevel(logging.INFO)
    for h in [h for h in root.handlers if getattr(h, "_rtanon_train", False)]:
        root.removeHandler(h)
        h.close()
    for h in (logging.FileHandler(out / "train.log"), logging.StreamHandler()):
        h.setFormatter(fmt)
        h._rtanon_train = True
        root.addHandler(h)


def train_content(cfg: TrainConfig) -> Path:
    """Runs (or resumes) the recipe; returns the path of the final checkpoint."""
    from rtanon.train.teacher import need_module

    torch = need_module("torch")
    from rtanon.content.model import ContentEncoder

    cfg.validate()
    out = Path(cfg.out_dir)
    _setup_logging(out)
    torch.set_num_threads(cfg.threads)
    log.info("config: %s", json.dumps(asdict(cfg), default=str))
    t_prep = time.time()
    caches = [build_cache(Path(d), cfg.cache) for d in cfg.data_dirs]
    k = cfg.model.n_units
    km = fit_units(caches, k, cfg.cache / f"kmeans_K{k}.npz", seed=cfg.seed)
    for c in caches:
        assign_units(c, km, k)
    log.info("teacher cache and units ready (%.0f s)", time.time() - t_prep)

    torch.manual_seed(cfg.seed)
    model = ContentEncoder(cfg.model)
    # training-only head: z -> standardised teacher features (paper 002's units keep only the argmax)
    head = torch.nn.Linear(cfg.model.unit_dim, TEACHER_DIM) if cfg.teacher_weight else None
    # the causal phone reader: a linear head on z, kept in the checkpoint
    phone_head = torch.nn.Linear(cfg.model.unit_dim, PHONE_TOKENS) if cfg.phone_weight else None
    rng = np.random.default_rng(cfg.seed)
    batches = _Batches(caches, k, cfg, rng, teacher_norm=(km["mean"], km["std"]) if head is not None else None)
    adversary = speaker_adversary(cfg.model.unit_dim, len(batches.speaker_index)) if cfg.speaker_adversary else None
    params = [p for m in (model, head, phone_head, adversary) if m is not None for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    ckpt_path = out / "ckpt.pt"
    step, train_s = 0, 0.0
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        if head is not None:
            head.load_state_dict(ck["head"])
        if phone_head is not None:
            phone_head.load_state_dict(ck["phone_head"])
        if adversary is not None:
            adversary.load_state_dict(ck["adversary"])
        opt.load_state_dict(ck["opt"])
        step, train_s = ck["step"], ck["train_s"]
        rng.bit_generator.state = ck["np_rng"]
        torch.set_rng_state(ck["torch_rng"])
        log.info("resumed from %s at step %d (%.1f min trained)", ckpt_path, step, train_s / 60)
    elif cfg.init is not None:
        ck = torch.load(cfg.init, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        for key, m in (("head", head), ("phone_head", phone_head)):  # the heads too, where both have them
            if m is not None and ck.get(key) is not None:
                m.load_state_dict(ck[key])
        log.info("warm start from %s", cfg.init)
    else:
        mean, std = _feature_stats(model, caches, rng)
        model.feat_mean.copy_(mean)
        model.feat_std.copy_(std)
    log.info("model: %d parameters; %d training crops sources", sum(p.numel() for p in model.parameters()),
             len(batches.items))

    def save():
        with atomic_open(ckpt_path) as f:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "train_s": train_s,
                        "np_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                        "model_config": cfg.model.to_dict(), "kmeans": str(cfg.cache / f"kmeans_K{k}.npz"),
                        "head": head.state_dict() if head is not None else None,
                        "phone_head": phone_head.state_dict() if phone_head is not None else None,
                        "adversary": adversary.state_dict() if adversary is not None else None}, f)
        log.info("checkpoint step %d (%.1f min trained)", step, train_s / 60)

    run_start = time.time()
    last_ckpt = time.time()
    acc_ema, loss_ema, reg_ema, phone_ema, adv_ema = None, None, None, None, None
    model.train()
    while step < cfg.max_steps and (time.time() - run_start) < cfg.max_minutes * 60:
        t0 = time.time()
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * step / cfg.max_steps))
        for g in opt.param_groups:
            g["lr"] = lr
        audio, units, fbs, teacher, phones, speakers = batches()
        audio_t, units_t = torch.from_numpy(audio), torch.from_numpy(units)
        state = model.init_state(cfg.batch_size)
        with torch.no_grad():
            logmel, _ = model.log_mel(audio_t, state[0], mel_fb=torch.from_numpy(fbs))
            if cfg.freq_masks or cfg.time_masks:
                spec_augment(logmel, rng, cfg.freq_masks, cfg.time_masks, cfg.freq_mask_max,
                             cfg.time_mask_max)
        logits, z, _ = model.encode_logmel(logmel, state[1:])
        la = cfg.model.lookahead_frames
        if la:  # output t + L stands for frame t: it has heard L frames past it
            logits, z, units_t = logits[:, la:], z[:, la:], units_t[:, :-la]
            teacher = teacher[:, :-la] if teacher is not None else None
            phones = phones[:, :-la] if phones is not None else None
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, k), units_t.reshape(-1), ignore_index=-100)
        ce = loss
        if head is not None:
            mask = (units_t >= 0)[..., None].float()
            reg = ((head(z) - torch.from_numpy(teacher)).abs() * mask).sum() / (mask.sum() * teacher.shape[2])
            loss = loss + cfg.teacher_weight * reg
            reg_ema = reg.item() if reg_ema is None else 0.98 * reg_ema + 0.02 * reg.item()
        if phone_head is not None:
            phone_logits = phone_head(z)
            pce = torch.nn.functional.cross_entropy(phone_logits.reshape(-1, PHONE_TOKENS),
                                                    torch.from_numpy(phones).reshape(-1), ignore_index=-100)
            loss = loss + cfg.phone_weight * pce
            with torch.no_grad():
                pmask = torch.from_numpy(phones) >= 0
                pacc = (phone_logits.argmax(-1)[pmask] == torch.from_numpy(phones)[pmask]).float().mean().item()
            phone_ema = pacc if phone_ema is None else 0.98 * phone_ema + 0.02 * pacc
        if adversary is not None:  # every speech frame (a unit other than padding) names the crop's speaker
            from rtanon.train.discriminators import reverse_gradient

            frame_spk = torch.from_numpy(speakers)[:, None].expand_as(units_t).masked_fill(units_t < 0, -100)
            spk_logits = adversary(reverse_gradient(z).transpose(1, 2)).transpose(1, 2)
            adv = torch.nn.functional.cross_entropy(spk_logits.reshape(-1, spk_logits.shape[-1]),
                                                    frame_spk.reshape(-1), ignore_index=-100)
            loss = loss + cfg.speaker_adversary * adv
            with torch.no_grad():
                amask = frame_spk >= 0
                aacc = (spk_logits.argmax(-1)[amask] == frame_spk[amask]).float().mean().item()
            adv_ema = aacc if adv_ema is None else 0.98 * adv_ema + 0.02 * aacc
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        step += 1
        train_s += time.time() - t0
        with torch.no_grad():
            mask = units_t >= 0
            acc = (logits.argmax(-1)[mask] == units_t[mask]).float().mean().item()
        acc_ema = acc if acc_ema is None else 0.98 * acc_ema + 0.02 * acc
        loss_ema = ce.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * ce.item()
        if step % 20 == 0:
            log.info("step %d lr %.2e loss %.3f (ema %.3f) train-acc %.3f (ema %.3f)%s%s%s %.2f s/step",
                     step, lr, ce.item(), loss_ema, acc, acc_ema,
                     f" teacher-L1 (ema) {reg_ema:.3f}" if reg_ema is not None else "",
                     f" phone-acc (ema) {phone_ema:.3f}" if phone_ema is not None else "",
                     f" adversary speaker-acc (ema) {adv_ema:.3f}" if adv_ema is not None else "", time.time() - t0)
        if time.time() - last_ckpt > cfg.checkpoint_every_s:
            save()
            last_ckpt = time.time()
    save()
    log.info("stopped at step %d of %d after %.1f min of training in total", step, cfg.max_steps, train_s / 60)
    return ckpt_path


def speaker_adversary(dim: int, n_speakers: int):
    """The training-only speaker classifier on z: (B, dim, T) -> (B, n_speakers, T) logits, two
    convolutions of 5 frames (180 ms of context around each frame)."""
    import torch

    return torch.nn.Sequential(torch.nn.Conv1d(dim, 256, 5, padding=2), torch.nn.ReLU(),
                               torch.nn.Conv1d(256, 256, 5, padding=2), torch.nn.ReLU(),
                               torch.nn.Conv1d(256, n_speakers, 1))


def load_checkpoint(path: Path):
    """The trained ``ContentEncoder`` (eval mode) from a ``ckpt.pt`` or a weights-only ``.pt``."""
    import torch

    from rtanon.content.model import ContentEncoder

    ck = torch.load(path, map_location="cpu", weights_only=False)
    model = ContentEncoder(ContentModelConfig.from_dict(ck["model_config"]))
    model.load_state_dict(ck["model"])
    return model.eval()
