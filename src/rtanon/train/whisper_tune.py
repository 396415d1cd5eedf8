"""Fine-tuning Whisper's encoder in its streaming form (``rtanon train content --whisper tiny.en``).

The network is :class:`rtanon.train.whisper.StreamingWhisperEncoder` with the pretrained weights loaded
(or an earlier run's, ``--init``); every step runs a batch of random crops through it from a zero state in
one call (the same graph as the stream: causal, the bounded window, one frame of lookahead) and fits each
output to its frame's full-context teacher (the same Whisper encoder reading the whole utterance, as cached by
:func:`rtanon.train.teacher.build_cache`):

- ``teacher_weight`` x the L1 distance between the standardised output and the standardised teacher frame
  (the k-means standardisation of ``<cache>/kmeans_K<K>.npz``), and
- the cross-entropy of the graph's unit probabilities (:class:`rtanon.train.whisper._ContentGraph`: minus
  the mean squared distance per dimension to the k-means centres) against the teacher's unit.

Each crop starts at a random position of Whisper's 1,500 (the stream's positions wrap every 30 s, so every
position, the wrap included, is trained). The crops, their augmentations (gain, white noise, speed) and the
evaluation-split refusal are the student recipe's (:mod:`rtanon.train.content`). Checkpoints (``ckpt.pt``:
weights, optimiser, step, random states) every ``checkpoint_every_s`` and at the end; a rerun resumes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from rtanon.atomic import atomic_open

log = logging.getLogger("rtanon.train.content")


def train_whisper_content(cfg) -> Path:
    """Runs (or resumes) the fine-tune of ``cfg`` (a :class:`rtanon.train.content.TrainConfig` with
    ``whisper`` set); returns the checkpoint's path."""
    import torch

    from rtanon.train.content import _Batches, _setup_logging
    from rtanon.train.teacher import assign_units, build_cache, fit_units
    from rtanon.train.whisper import POSITIONS, StreamingWhisperEncoder, WhisperEncoder, _ContentGraph, encoder_weights

    cfg.validate()
    out = Path(cfg.out_dir)
    _setup_logging(out)
    torch.set_num_threads(cfg.threads)
    log.info("config: %s", json.dumps(asdict(cfg), default=str))
    caches = [build_cache(Path(d), cfg.cache) for d in cfg.data_dirs]
    k = cfg.model.n_units
    km = fit_units(caches, k, cfg.cache / f"kmeans_K{k}.npz", seed=cfg.seed)
    for c in caches:
        assign_units(c, km, k)
    torch.manual_seed(cfg.seed)
    stream = StreamingWhisperEncoder(WhisperEncoder.from_ct2(encoder_weights(cfg.whisper)), cfg.window_frames)
    graph = _ContentGraph(stream, km)
    rng = np.random.default_rng(cfg.seed)
    batches = _Batches(caches, k, cfg, rng, teacher_norm=(km["mean"], km["std"]))
    params = list(stream.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    ckpt_path = out / "ckpt.pt"
    step, train_s = 0, 0.0
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        stream.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, train_s = ck["step"], ck["train_s"]
        rng.bit_generator.state = ck["np_rng"]
        torch.set_rng_state(ck["torch_rng"])
        log.info("resumed from %s at step %d (%.1f min trained)", ckpt_path, step, train_s / 60)
    elif cfg.init is not None:
        stream.load_state_dict(load_weights(cfg.init))
        log.info("warm start from %s", cfg.init)
    mean, std = torch.from_numpy(km["mean"]), torch.from_numpy(km["std"])
    meta = {"whisper": cfg.whisper, "window_frames": cfg.window_frames, "kmeans": str(cfg.cache / f"kmeans_K{k}.npz")}

    def save():
        with atomic_open(ckpt_path) as f:
            torch.save({"model": stream.state_dict(), "opt": opt.state_dict(), "step": step, "train_s": train_s,
                        "np_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), **meta}, f)
        log.info("checkpoint step %d (%.1f min trained)", step, train_s / 60)

    run_start = last_ckpt = time.time()
    ema: dict[str, float] = {}
    stream.train()
    while step < cfg.max_steps and (time.time() - run_start) < cfg.max_minutes * 60:
        t0 = time.time()
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * step / cfg.max_steps))
        for g in opt.param_groups:
            g["lr"] = lr
        audio, units, _, teacher, _, _ = batches()
        state = list(stream.init_state(cfg.batch_size))
        stream.position_offset = int(rng.integers(POSITIONS))
        probs, z, *_ = graph(torch.from_numpy(audio), *state)
        # output t + 1 stands for frame t (one frame of lookahead)
        probs, z = probs[:, 1:], z[:, 1:]
        units_t, teacher_t = torch.from_numpy(units[:, :-1]), torch.from_numpy(teacher[:, :-1])
        mask = (units_t >= 0)[..., None].float()
        reg = (((z - mean) / std - teacher_t).abs() * mask).sum() / (mask.sum() * z.shape[2])
        ce = torch.nn.functional.nll_loss(torch.log(probs.clamp_min(1e-8)).reshape(-1, k), units_t.reshape(-1),
                                          ignore_index=-100)
        loss = ce + cfg.teacher_weight * reg
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        step += 1
        train_s += time.time() - t0
        with torch.no_grad():
            sel = units_t >= 0
            acc = (probs.argmax(-1)[sel] == units_t[sel]).float().mean().item()
        for name, value in (("ce", ce.item()), ("l1", reg.item()), ("acc", acc)):
            ema[name] = value if name not in ema else 0.98 * ema[name] + 0.02 * value
        if step % 10 == 0:
            log.info("step %d lr %.2e ce %.3f (ema %.3f) teacher-L1 %.3f (ema %.3f) train-acc (ema) %.3f %.2f s/step",
                     step, lr, ce.item(), ema["ce"], reg.item(), ema["l1"], ema["acc"], time.time() - t0)
        if time.time() - last_ckpt > cfg.checkpoint_every_s:
            save()
            last_ckpt = time.time()
    stream.position_offset = 0
    save()
    log.info("stopped at step %d of %d after %.1f min of training in total", step, cfg.max_steps, train_s / 60)
    return ckpt_path


def load_weights(path: str | Path) -> dict:
    """A fine-tune's network weights (float32) from its ``ckpt.pt`` or a float16 weights file
    (``rtanon lab export-whisper --weights``)."""
    import torch

    ck = torch.load(path, map_location="cpu", weights_only=False)
    return {name: t.float() for name, t in ck["model"].items()}
