"""The vocoder's training loop: random segments of the feature shards (:mod:`rtanon.train.shards`), the
generator from the zero state, the HiFi-GAN losses, resumable checkpoints.

:func:`train_vocoder` draws ``batch_size`` random segments of ``segment_frames`` frames; the first
``context_frames`` frames of each are left out of the losses (the streaming model always has history at run
time). Losses: 45 x mel L1 + multi-resolution STFT from step 0; MPD/MSD adversarial + 2 x feature matching
from ``adversarial_start_step`` (paper 002 Eq. 2-5; by default from step 0 on CUDA and never on a CPU,
where they cost about 10x per step); optionally the content-consistency loss (``content_loss_weight``): the
frozen content encoder's ``z`` of the output against its ``z`` of the target, 1 - cosine per frame. Until
``residual_start_step`` only the envelope synthesiser's speech is trained (the upsampling stack is not
run: about half the cost of a step). Each item's speaker embedding is blended with another training
speaker's with probability ``blend_prob`` (:class:`BlendWithOtherSpeaker`), so voices between training
speakers, the pseudo-speakers, stay in range. Fixed seeds: batch ``s`` is drawn from
``np.random.default_rng([seed, s])``, so a resumed run sees the same data as an uninterrupted one. AMP
(bf16, or fp16 with a gradient scaler) on CUDA only.

Run directory (never the working directory by default: the caller names it)::

    run/
      config.json        the TrainConfig
      train.log          one JSON line per logged step
      generator.pt       latest generator weights + config + step (small: commit this one)
      trainer.pt         latest discriminators, optimisers, schedulers, scaler, step (large)
      checkpoints/generator_step00001000.pt ...

Resuming (``resume=True``, the default) loads ``trainer.pt`` and ``generator.pt`` when present; with only
``generator.pt`` (the file committed to the repository) training continues from those weights with fresh
discriminators and optimisers.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from rtanon.atomic import atomic_open, write_text
from rtanon.config import ConfigError
from rtanon.constants import FRAME_SAMPLES
from rtanon.neural.config import VocoderConfig
from rtanon.train.shards import ShardDataset
from rtanon.train.vocoder_config import TrainConfig


@dataclass(frozen=True)
class BlendWithOtherSpeaker:
    """Embedding blending: with probability ``prob`` an item's embedding becomes
    ``(1 - w) e + w e_other`` (``w ~ U(0, max_weight)``, ``e_other`` another training speaker's),
    rescaled to the original norm. The target audio stays the original speaker's, so keep
    ``max_weight`` small: it teaches the vocoder that nearby embeddings give nearby voices, which is
    what the pseudo-speakers between training speakers need."""

    prob: float = 0.3
    max_weight: float = 0.2

    def __call__(self, embeddings, speaker, table, rng):
        out = embeddings.copy()
        n = table.shape[0]
        if n < 2:
            return out
        for b in np.nonzero(rng.random(len(out)) < self.prob)[0]:
            other = int(rng.integers(0, n - 1))
            other += other >= speaker[b]
            w = rng.uniform(0.0, self.max_weight)
            mixed = (1.0 - w) * out[b] + w * table[other]
            out[b] = mixed * (np.linalg.norm(out[b]) / max(np.linalg.norm(mixed), 1e-8))
        return out


# ---- training ---------------------------------------------------------------------------------

def content_consistency_loss(content_model, fake, real):
    """Mean over frames of 1 - cos(z(fake), z(real)): ``fake``/``real`` (B, N) audio, N a multiple of 320,
    both encoded by ``content_model`` (a ``ContentEncoder``) from its zero state; gradients flow through
    the ``fake`` side only."""
    import torch

    state = tuple(s.to(fake.device) for s in content_model.init_state(fake.shape[0]))
    with torch.no_grad():
        z_real = content_model(real, *state)[1]
    z_fake = content_model(fake, *state)[1]
    return (1.0 - torch.nn.functional.cosine_similarity(z_fake, z_real, dim=-1)).mean()


def _torch_save(obj, path: Path) -> None:
    import torch

    with atomic_open(path) as f:
        torch.save(obj, f)


def warm_start(path: str | Path, vocoder_config: VocoderConfig) -> dict:
    """A ``generator.pt`` checkpoint for ``vocoder_config`` from the weights at ``path``, which may have fewer
    pre-net convolutions: the missing ones start at zero (weight-norm gain 0), so the new model computes
    what the old one did and training then grows them.
    Content of another width (``units_dim``: a new content encoder) gets a fresh input convolution
    (``conv_pre``, PyTorch's own initialisation): what follows it, the speaker conditioning, the envelope
    head and the synthesiser, starts trained. Every other weight must match in shape."""
    import torch

    from rtanon.neural.vocoder import HarmonicNoiseVocoder, load_generator

    old = load_generator(path)
    model = HarmonicNoiseVocoder(vocoder_config)
    state = old.state_dict()
    new_content = old.config.units_dim != vocoder_config.units_dim
    if new_content:
        state = {k: v for k, v in state.items() if not k.startswith("conv_pre.")}
    may_be_new = ("prenet.",) + (("conv_pre.",) if new_content else ())
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a shape mismatch
        raise ConfigError(f"{path} does not fit the vocoder config: {str(exc).splitlines()[-1].strip()}") from None
    if unexpected or any(not k.startswith(may_be_new) for k in missing):
        raise ConfigError(f"{path} does not fit the vocoder config: missing {missing[:4]}, unexpected "
                          f"{unexpected[:4]}; only pre-net convolutions may be new")
    with torch.no_grad():
        for i, conv in enumerate(model.prenet):
            if not any(k.startswith(f"prenet.{i}.") for k in missing):
                continue  # trained in the old checkpoint: kept
            inner = conv.conv
            if torch.nn.utils.parametrize.is_parametrized(inner, "weight"):
                inner.parametrizations.weight.original0.zero_()
            else:
                inner.weight.zero_()
            inner.bias.zero_()
    step = int(torch.load(path, map_location="cpu", weights_only=True)["step"])
    return {"generator": model.state_dict(), "config": asdict(vocoder_config), "step": step}


def train_vocoder(config: TrainConfig, data: ShardDataset, run_dir: str | Path, device: str | None = None,
                  resume: bool = True, max_steps: int | None = None,
                  on_log: Callable[[dict], None] | None = None, max_minutes: float | None = None,
                  content_model=None) -> dict:
    """Trains (or resumes training of) the vocoder until ``config.steps`` (or ``max_steps`` more steps in
    this call, or until ``max_minutes`` of wall clock, with a checkpoint). Returns the last log record
    (``{"step": N}`` alone when the run was already at its last step). See the module docstring for the
    run directory.

    ``content_model``: the torch ``ContentEncoder`` whose ``z`` fills the shards
    (``rtanon.train.content.load_checkpoint``), needed when ``config.content_loss_weight`` > 0; it is frozen
    here."""
    import torch

    from rtanon.neural.vocoder import HarmonicNoiseVocoder
    from rtanon.train.discriminators import Discriminators
    from rtanon.train.losses import MelLoss, MultiResolutionStftLoss, discriminator_loss, generator_loss

    config.validate()
    if data.units_dim != config.vocoder.units_dim or data.embeddings.shape[1] != config.vocoder.speaker_dim:
        raise ConfigError(f"the shards hold units_dim={data.units_dim}, speaker_dim={data.embeddings.shape[1]}; "
                          f"the vocoder config expects {config.vocoder.units_dim} and {config.vocoder.speaker_dim}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    run_dir = Path(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    write_text(run_dir / "config.json", json.dumps(config.to_json(), indent=1, default=list))

    torch.manual_seed(config.seed)
    random.seed(config.seed)
    gen = HarmonicNoiseVocoder(config.vocoder).to(device)
    disc = Discriminators(config.discriminators).to(device)
    opt_g = torch.optim.AdamW(gen.parameters(), config.learning_rate, betas=config.adam_betas)
    opt_d = torch.optim.AdamW(disc.parameters(), config.learning_rate, betas=config.adam_betas)
    gamma = config.lr_decay ** (1.0 / config.lr_decay_every)
    sched_g = torch.optim.lr_scheduler.ExponentialLR(opt_g, gamma)
    sched_d = torch.optim.lr_scheduler.ExponentialLR(opt_d, gamma)
    use_amp = config.amp and device.startswith("cuda")
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    mel_loss = MelLoss().to(device)
    stft_loss = MultiResolutionStftLoss().to(device)
    if config.content_loss_weight > 0:
        if content_model is None:
            raise ConfigError("a content loss needs the content encoder's torch weights (content_model)")
        content_model = content_model.to(device).eval()
        content_model.requires_grad_(False)
    adversarial_start = config.adversarial_start_step
    if adversarial_start is None:
        adversarial_start = 0 if device.startswith("cuda") else math.inf
    augment = BlendWithOtherSpeaker(prob=config.blend_prob) if config.blend_prob > 0 else None

    step = 0
    gen_path, trainer_path = run_dir / "generator.pt", run_dir / "trainer.pt"
    if resume and gen_path.exists():
        g_ckpt = torch.load(gen_path, map_location=device, weights_only=True)
        gen.load_state_dict(g_ckpt["generator"])
        step = int(g_ckpt["step"])
        if trainer_path.exists():
            # on the CPU: the RNG state must stay a CPU tensor; optimisers and modules move theirs to
            # their parameters' device as they load
            t_ckpt = torch.load(trainer_path, map_location="cpu", weights_only=False)
            if int(t_ckpt["step"]) == step:
                disc.load_state_dict(t_ckpt["discriminators"])
                opt_g.load_state_dict(t_ckpt["opt_g"])
                opt_d.load_state_dict(t_ckpt["opt_d"])
                sched_g.load_state_dict(t_ckpt["sched_g"])
                sched_d.load_state_dict(t_ckpt["sched_d"])
                scaler.load_state_dict(t_ckpt["scaler"])
                torch.set_rng_state(t_ckpt["torch_rng"])

    def save(step: int) -> None:
        g_state = {"generator": gen.state_dict(), "config": asdict(config.vocoder), "step": step}
        _torch_save(g_state, gen_path)
        trainer = {"step": step, "discriminators": disc.state_dict(), "opt_g": opt_g.state_dict(),
                   "opt_d": opt_d.state_dict(), "sched_g": sched_g.state_dict(), "sched_d": sched_d.state_dict(),
                   "scaler": scaler.state_dict(), "torch_rng": torch.get_rng_state()}
        _torch_save(trainer, trainer_path)
        _torch_save(g_state, run_dir / "checkpoints" / f"generator_step{step:08d}.pt")
        old = sorted((run_dir / "checkpoints").glob("generator_step*.pt"))[:-config.keep_checkpoints]
        for p in old:
            p.unlink()

    end = config.steps if max_steps is None else min(config.steps, step + max_steps)
    ctx = config.context_frames * FRAME_SAMPLES
    record: dict = {}
    log = open(run_dir / "train.log", "a")
    t_last = t_start = time.perf_counter()
    logged = step
    try:
        gen.train()
        disc.train()
        while step < end:
            rng = np.random.default_rng([config.seed, step])
            b = data.batch(rng, config.batch_size, config.segment_frames)
            emb = data.embeddings[b["speaker"]]
            if augment is not None:
                emb = augment(emb, b["speaker"], data.embeddings, rng)
            noise = rng.standard_normal(b["audio"].shape, dtype=np.float32)
            units, f0, spk, noise_t, real = (torch.from_numpy(np.ascontiguousarray(a)).to(device)
                                             for a in (b["units"], b["f0_hz"], emb, noise, b["audio"]))
            real = real[:, None, ctx:]
            adversarial = step >= adversarial_start
            residual = step >= config.residual_start_step
            with torch.autocast("cuda", dtype=amp_dtype, enabled=use_amp):
                fake = gen(units, f0, spk, noise_t, residual=residual)[:, None, ctx:]
            fake = fake.float()

            d_loss_value = 0.0
            if adversarial:
                with torch.autocast("cuda", dtype=amp_dtype, enabled=use_amp):
                    real_scores, _ = disc(real)
                    fake_scores, _ = disc(fake.detach())
                    d_loss = discriminator_loss(real_scores, fake_scores)
                opt_d.zero_grad(set_to_none=True)
                scaler.scale(d_loss).backward()
                scaler.unscale_(opt_d)
                torch.nn.utils.clip_grad_norm_(disc.parameters(), config.grad_clip)
                scaler.step(opt_d)
                d_loss_value = float(d_loss.detach())

            with torch.autocast("cuda", dtype=amp_dtype, enabled=use_amp):
                if adversarial:
                    fake_scores, fake_fmaps = disc(fake)
                    with torch.no_grad():
                        _, real_fmaps = disc(real)
                else:
                    fake_scores = fake_fmaps = real_fmaps = None
            mel = mel_loss(fake, real)
            stft = stft_loss(fake, real)
            g_loss, parts = generator_loss(mel, fake_scores, real_fmaps, fake_fmaps, stft)
            if config.content_loss_weight > 0:
                closs = content_consistency_loss(content_model, fake[:, 0], real[:, 0])
                g_loss = g_loss + config.content_loss_weight * closs
                parts["content"] = float(closs.detach())
                parts["total"] += config.content_loss_weight * parts["content"]
            opt_g.zero_grad(set_to_none=True)
            scaler.scale(g_loss).backward()
            scaler.unscale_(opt_g)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(gen.parameters(), config.grad_clip))
            scaler.step(opt_g)
            scaler.update()
            sched_g.step()
            if adversarial:
                sched_d.step()
            step += 1
            if not math.isfinite(parts["total"]):
                raise FloatingPointError(f"non-finite generator loss at step {step}: {parts}")

            out_of_time = max_minutes is not None and time.perf_counter() - t_start > 60.0 * max_minutes
            if step % config.log_every == 0 or step == end or out_of_time:  # the last step is always logged
                now = time.perf_counter()
                record = {"step": step, **{f"g_{k}": round(v, 5) for k, v in parts.items()},
                          "d_total": round(d_loss_value, 5), "grad_norm_g": round(grad_norm, 3),
                          "lr": sched_g.get_last_lr()[0], "sec_per_step": round((now - t_last) / (step - logged), 4),
                          "device": device}
                t_last, logged = now, step
                log.write(json.dumps(record) + "\n")
                log.flush()
                if on_log:
                    on_log(record)
            if step % config.checkpoint_every == 0 or step == end or out_of_time:
                save(step)
            if out_of_time:
                break
    finally:
        log.close()
    return record or {"step": step}  # a run already at its last step trains nothing: where it stands


