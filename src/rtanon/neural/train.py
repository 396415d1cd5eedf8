"""Vocoder training: compact feature shards, the dataset over them, and a resumable loop.

Shard directory layout (written by :class:`ShardWriter`, read by :class:`ShardDataset`)::

    shards/
      manifest.json      format, units_dim, the content encoder's sha256, rates, speaker ids, one entry per shard
                         (file, utterances, frames, bytes, sha256)
      speakers.npz       embeddings float32 (n_speakers, 256): one per *training* speaker
      shard_00000.npz    one shard: many utterances concatenated
      ...

One shard (``np.savez``; uncompressed so it memory-maps quickly, a 16 MiB
default cap so that a machine that only sees a 64 MiB working tree can carry
a few at a time and accumulate them between calls)::

    units    float16 (sum T, K)    soft units at 50 Hz
    f0_hz    float32 (sum 2T,)     F0 at 100 Hz, 0 = unvoiced
    audio    int16   (sum 320T,)   16 kHz target audio
    frames   int32   (U,)          T of each utterance (offsets are the cumulative sums)
    speaker  int32   (U,)          row of speakers.npz for each utterance
    utt_ids  str     (U,)

Sizes: about 46 KB per second of speech with K = 128 dense units (audio 32 KB/s,
units 12.8 KB/s, F0 0.8 KB/s), so a 16 MiB shard holds about 6 minutes.

Training (:func:`train_vocoder`): random segments of ``segment_frames`` frames
from the loaded shards; the generator runs from the zero state and the first
``context_frames`` frames of each segment are left out of the losses (the
streaming model always has history at run time). Losses: 45 x mel L1 +
multi-resolution STFT from step 0; MPD/MSD adversarial + 2 x feature matching
from ``adversarial_start_step`` (paper 002 Eq. 2-5); optionally a content-consistency
loss (``content_loss_weight``): the frozen content encoder's ``z`` of the output
against its ``z`` of the target, 1 - cosine per frame. Fixed seeds: batch ``s``
is drawn from ``np.random.default_rng([seed, s])``, so a resumed run sees the
same data as an uninterrupted one. AMP (bf16, or fp16 with a gradient scaler)
on CUDA only.

Run directory (never the working directory by default: the caller names it)::

    run/
      config.json        the TrainConfig
      train.log          one JSON line per logged step
      generator.pt       latest generator weights + config + step (small: commit this one)
      trainer.pt         latest discriminators, optimisers, schedulers, scaler, step (large)
      checkpoints/generator_step00001000.pt ...

Resuming (``resume=True``, the default) loads ``trainer.pt`` and
``generator.pt`` when present; with only ``generator.pt`` (the file committed
to the repository) training continues from those weights with fresh
discriminators and optimisers.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ, ConfigError
from rtanon.neural.rates import F0_RATE_HZ, FRAME_RATE_HZ, HOP_SAMPLES

SHARD_FORMAT = "rtanon-vocoder-shards-v1"


# ---- shards -----------------------------------------------------------------------------------

class ShardWriter:
    """Writes utterances into shards of at most ``max_shard_mib`` MiB plus the manifest.

    ``add(utt_id, speaker_index, units (T, K), f0_hz (2T,), audio (320 T,) float in [-1, 1] or int16)``;
    ``close(speaker_ids, speaker_embeddings (n, S) float32)`` writes the last shard, ``speakers.npz`` and
    ``manifest.json``. Use as a context manager only when the speakers are known up front.
    """

    def __init__(self, out_dir: str | Path, units_dim: int, max_shard_mib: float = 16.0,
                 units_kind: str = "probs", content_sha256: str = "") -> None:
        self.out_dir = Path(out_dir)
        self.units_kind = units_kind
        self.content_sha256 = content_sha256
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.units_dim = units_dim
        self.max_bytes = int(max_shard_mib * 2**20)
        self._entries: list[dict] = []
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._buf: dict[str, list] = {"units": [], "f0_hz": [], "audio": [], "frames": [], "speaker": [],
                                      "utt_ids": []}
        self._bytes = 0

    def add(self, utt_id: str, speaker_index: int, units: np.ndarray, f0_hz: np.ndarray,
            audio: np.ndarray) -> None:
        t = units.shape[0]
        if units.ndim != 2 or units.shape[1] != self.units_dim:
            raise ValueError(f"{utt_id}: units must be (T, {self.units_dim}), got {units.shape}")
        if f0_hz.shape != (2 * t,) or audio.shape != (HOP_SAMPLES * t,):
            raise ValueError(f"{utt_id}: for T={t} frames f0_hz must be ({2 * t},) at 100 Hz and audio "
                             f"({HOP_SAMPLES * t},) at 16 kHz; got {f0_hz.shape} and {audio.shape} "
                             "(trim the audio to a whole number of 20 ms frames)")
        if audio.dtype != np.int16:
            audio = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
        size = t * (2 * self.units_dim + 8 + 2 * HOP_SAMPLES)
        if self._bytes and self._bytes + size > self.max_bytes:
            self._flush()
        self._buf["units"].append(units.astype(np.float16))
        self._buf["f0_hz"].append(f0_hz.astype(np.float32))
        self._buf["audio"].append(audio)
        self._buf["frames"].append(t)
        self._buf["speaker"].append(int(speaker_index))
        self._buf["utt_ids"].append(str(utt_id))
        self._bytes += size

    def _flush(self) -> None:
        if not self._buf["frames"]:
            return
        name = f"shard_{len(self._entries):05d}.npz"
        path = self.out_dir / name
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, units=np.concatenate(self._buf["units"]), f0_hz=np.concatenate(self._buf["f0_hz"]),
                 audio=np.concatenate(self._buf["audio"]), frames=np.asarray(self._buf["frames"], np.int32),
                 speaker=np.asarray(self._buf["speaker"], np.int32), utt_ids=np.asarray(self._buf["utt_ids"]))
        os.replace(tmp, path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self._entries.append({"file": name, "utterances": len(self._buf["frames"]),
                              "frames": int(sum(self._buf["frames"])), "bytes": path.stat().st_size,
                              "sha256": digest})
        self._reset_buffer()

    def close(self, speaker_ids: list[str], speaker_embeddings: np.ndarray) -> Path:
        self._flush()
        emb = np.asarray(speaker_embeddings, np.float32)
        if emb.ndim != 2 or emb.shape[0] != len(speaker_ids):
            raise ValueError(f"speaker_embeddings must be ({len(speaker_ids)}, S), got {emb.shape}")
        np.savez(self.out_dir / "speakers.npz", embeddings=emb, ids=np.asarray(speaker_ids))
        manifest = {"format": SHARD_FORMAT, "units_dim": self.units_dim, "units_kind": self.units_kind,
                    "content_sha256": self.content_sha256,
                    "speaker_dim": int(emb.shape[1]),
                    "sample_rate_hz": SAMPLE_RATE_HZ, "frame_rate_hz": FRAME_RATE_HZ, "f0_rate_hz": F0_RATE_HZ,
                    "speakers": list(speaker_ids), "shards": self._entries}
        path = self.out_dir / "manifest.json"
        path.write_text(json.dumps(manifest, indent=1))
        return path


class ShardDataset:
    """The utterances of the shards in ``shard_dir`` that are present (all listed ones by default, or
    the files named in ``shards``), held in memory, with random fixed-length segments.

    ``units_temperature``: sharpen the stored soft units to this Eq. 1 temperature on load (the shards
    hold them at the content encoder's trained 0.1); ignored for shards of projections
    (``units_kind`` "z" in the manifest).

    ``batch(rng, batch_size, segment_frames)`` -> dict of numpy arrays: ``units`` (B, S, K) float32,
    ``f0_hz`` (B, 2S) float32, ``audio`` (B, 320 S) float32 in [-1, 1], ``speaker`` (B,) int64 rows of
    ``embeddings`` (n_speakers, D) float32. Utterances shorter than a segment are zero-padded (silence,
    unvoiced) at the end.
    """

    def __init__(self, shard_dir: str | Path, shards: list[str] | None = None, verify: bool = False,
                 units_temperature: float | None = None) -> None:
        shard_dir = Path(shard_dir)
        manifest = json.loads((shard_dir / "manifest.json").read_text())
        if manifest.get("format") != SHARD_FORMAT:
            raise ValueError(f"{shard_dir} is not a {SHARD_FORMAT} directory (format {manifest.get('format')!r})")
        self.manifest = manifest
        self.units_dim = int(manifest["units_dim"])
        self.units_kind = str(manifest.get("units_kind", "probs"))
        #: the content encoder that made the units ("" in shards from before it was recorded)
        self.content_sha256 = str(manifest.get("content_sha256", ""))
        if self.units_kind != "probs":
            units_temperature = None  # projections are not a distribution: nothing to sharpen
        spk = np.load(shard_dir / "speakers.npz")
        self.embeddings = spk["embeddings"].astype(np.float32)
        wanted = set(shards) if shards is not None else None
        entries = [e for e in manifest["shards"] if (wanted is None or e["file"] in wanted)
                   and (shard_dir / e["file"]).exists()]
        if not entries:
            raise FileNotFoundError(f"no shard files of {shard_dir}/manifest.json are present"
                                    + (f" among {sorted(wanted)}" if wanted else ""))
        units, f0, audio, frames, speaker = [], [], [], [], []
        for e in entries:
            path = shard_dir / e["file"]
            if verify and hashlib.sha256(path.read_bytes()).hexdigest() != e["sha256"]:
                raise ValueError(f"{path} does not match its sha256 in the manifest (partial copy?)")
            with np.load(path) as z:
                units.append(z["units"])
                f0.append(z["f0_hz"])
                audio.append(z["audio"])
                frames.append(z["frames"])
                speaker.append(z["speaker"])
        self.units = np.concatenate(units)
        if units_temperature is not None:  # the shards hold the content encoder's trained temperature
            from rtanon.content.stream import sharpen_units

            self.units = np.concatenate([sharpen_units(self.units[i:i + 65536], units_temperature)
                                         for i in range(0, len(self.units), 65536)]).astype(np.float16)
        self.f0_hz = np.concatenate(f0)
        self.audio = np.concatenate(audio)
        self.frames = np.concatenate(frames).astype(np.int64)
        self.speaker = np.concatenate(speaker).astype(np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.frames)[:-1]))
        self.shard_files = [e["file"] for e in entries]
        self.units_temperature = 0.1 if units_temperature is None else float(units_temperature)

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    @property
    def total_seconds(self) -> float:
        return float(self.frames.sum()) / FRAME_RATE_HZ

    def batch(self, rng: np.random.Generator, batch_size: int, segment_frames: int) -> dict[str, np.ndarray]:
        k, s = self.units_dim, segment_frames
        out = {"units": np.zeros((batch_size, s, k), np.float32), "f0_hz": np.zeros((batch_size, 2 * s), np.float32),
               "audio": np.zeros((batch_size, HOP_SAMPLES * s), np.float32),
               "speaker": np.zeros(batch_size, np.int64)}
        # utterances drawn in proportion to their length, so every second of speech is equally likely
        p = self.frames / self.frames.sum()
        for b, u in enumerate(rng.choice(len(self), size=batch_size, p=p)):
            n = int(self.frames[u])
            start = int(rng.integers(0, n - s + 1)) if n > s else 0
            m = min(s, n - start)
            f = int(self.offsets[u]) + start
            out["units"][b, :m] = self.units[f:f + m]
            out["f0_hz"][b, :2 * m] = self.f0_hz[2 * f:2 * (f + m)]
            out["audio"][b, :HOP_SAMPLES * m] = self.audio[HOP_SAMPLES * f:HOP_SAMPLES * (f + m)] / 32768.0
            out["speaker"][b] = self.speaker[u]
        return out


# ---- augmentation -----------------------------------------------------------------------------

class SpeakerAugment(Protocol):
    def __call__(self, embeddings: np.ndarray, speaker: np.ndarray, table: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
        """``embeddings`` (B, D) of the batch's speakers (rows ``speaker`` of ``table``) -> (B, D)."""
        ...


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

def noisy_units(units: np.ndarray, max_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """``units`` (B, T, D) plus Gaussian noise whose expected norm is ``f`` times each frame's norm, ``f``
    drawn per segment from U(0, ``max_fraction``) (:attr:`TrainConfig.units_noise`)."""
    b, _, d = units.shape
    frac = rng.uniform(0.0, max_fraction, size=(b, 1, 1)).astype(np.float32)
    norm = np.linalg.norm(units, axis=2, keepdims=True)
    eps = rng.standard_normal(units.shape, dtype=np.float32)
    return (units + frac * norm / np.sqrt(d) * eps).astype(np.float32)


def _vocoder_config_default():
    from rtanon.neural.config import VocoderConfig

    return VocoderConfig()


def _disc_config_default():
    from rtanon.neural.config import DiscriminatorConfig

    return DiscriminatorConfig()


#: what the converted pass's losses hear (``TrainConfig.converted_pass``)
CONVERTED_PASSES = ("output", "synthesis")


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters (HiFi-GAN's optimiser settings)."""

    vocoder: object = field(default_factory=_vocoder_config_default)  # VocoderConfig
    discriminators: object = field(default_factory=_disc_config_default)  # DiscriminatorConfig
    steps: int = 200_000
    batch_size: int = 16
    segment_frames: int = 40  # 0.8 s
    context_frames: int = 4  # left out of the losses (zero-state warm-up)
    learning_rate: float = 2e-4
    adam_betas: tuple[float, float] = (0.8, 0.99)
    lr_decay: float = 0.999  # per lr_decay_every steps
    lr_decay_every: int = 1000
    adversarial_start_step: int = 0
    #: Envelope source only: steps trained on the synthesised speech alone (the upsampling stack is not run,
    #: so a step costs about half); the stack's residual joins at this step.
    residual_start_step: int = 4000
    use_stft_loss: bool = True
    grad_clip: float = 1000.0
    #: Weight of the pre-net's frame-level log-mel L1 (VocoderConfig.aux_mel_bins > 0 only; the waveform's own
    #: mel L1 has weight 45 in Eq. 4).
    aux_mel_weight: float = 15.0
    #: Content-noise augmentation: each segment's content frames get Gaussian noise whose norm is a fraction,
    #: drawn uniformly from [0, units_noise] per segment, of each frame's own norm (0 = off). The content
    #: encoder is less accurate on unseen speakers than on the training speakers whose features fill the
    #: shards; this is meant to teach the vocoder less exact content (0.5 and 1.0 did not change so762_dev WER
    #: measurably: models/neural/README.md, "Tried, not shipped").
    units_noise: float = 0.0
    #: Content-consistency loss: weight of 1 - cos(z(output), z(target)) per 20 ms frame, both from the frozen
    #: content encoder run from the zero state over the segment's loss frames (0 = off). The mel and STFT
    #: losses weigh every band alike; this one weighs what the encoder (distilled from an ASR model) hears.
    content_loss_weight: float = 0.0
    #: Converted-voice content loss: the first ``converted_fraction`` of each batch is rendered a second time
    #: in a pseudo-speaker's voice (``train_vocoder``'s ``conversion_targets``: embedding, and the F0 moved
    #: to its median), and this weighs the same 1 - cos(z(converted), z(target)) on it. Training otherwise
    #: sees only the speaker's own voice, while the method always renders another one (0 = off).
    #: The content losses also compare the encoder's residual layers (``content_consistency_loss(layers=True)``).
    content_loss_layers: bool = False
    converted_content_weight: float = 0.0
    converted_fraction: float = 0.5
    #: Speaker loss on the converted pass (``rtanon.neural.speaker_loss``): weight of cos(E(converted),
    #: E(source)) - cos(E(converted), pseudo-speaker) with E resemblyzer's encoder (0 = off). The only term that
    #: says the pseudo-speaker, not a content input, must give the voice.
    speaker_loss_weight: float = 0.0
    #: What the converted pass's losses hear: ``"output"`` (the vocoder's output) or ``"synthesis"`` (the
    #: envelope synthesiser's speech alone, without the upsampling stack's residual). With ``"synthesis"``
    #: the converted-voice losses train only the pre-net and the envelopes, so the speaker loss must move
    #: the spectral envelope; on the output, the stack learnt a waveform residual against the embedder
    #: that made the voice breathy (``models/neural/README.md``, ninth session).
    converted_pass: str = "output"
    checkpoint_every: int = 1000
    keep_checkpoints: int = 5
    log_every: int = 50
    seed: int = 0
    amp: bool = True  # CUDA only

    def validate(self) -> None:
        self.vocoder.validate()
        self.discriminators.validate()
        if not 0 <= self.context_frames < self.segment_frames:
            raise ConfigError(f"context_frames={self.context_frames} must be in [0, segment_frames="
                              f"{self.segment_frames})")
        if (self.segment_frames - self.context_frames) * HOP_SAMPLES <= 1024:
            raise ConfigError(f"segment_frames - context_frames = {self.segment_frames - self.context_frames}; "
                              "use at least 4 frames of loss (the 2048-point STFT of the MR-STFT loss needs more "
                              "than 1024 samples)")
        if self.batch_size < 1 or self.steps < 1 or self.checkpoint_every < 1 or self.log_every < 1:
            raise ConfigError("batch_size, steps, checkpoint_every and log_every must be >= 1")
        if self.content_loss_weight < 0 or self.converted_content_weight < 0 or self.speaker_loss_weight < 0:
            raise ConfigError(f"content_loss_weight={self.content_loss_weight}, converted_content_weight="
                              f"{self.converted_content_weight}, speaker_loss_weight={self.speaker_loss_weight}; "
                              "use 0 (off) or more")
        if self.converted_pass not in CONVERTED_PASSES:
            raise ConfigError(f"converted_pass={self.converted_pass!r}; use one of {CONVERTED_PASSES}")
        if self.converted_pass == "synthesis" and self.vocoder.source_type != "envelope":
            raise ConfigError("converted_pass='synthesis' needs the envelope source (source_type='envelope')")
        if not 0.0 < self.converted_fraction <= 1.0:
            raise ConfigError(f"converted_fraction={self.converted_fraction}; use a fraction in (0, 1]")
        if not 0.0 <= self.units_noise <= 2.0:
            raise ConfigError(f"units_noise={self.units_noise}; use 0 (off) to 2 (noise up to twice the content's "
                              "norm)")

    def to_json(self) -> dict:
        return asdict(self)


def content_consistency_loss(content_model, fake, real, layers: bool = False):
    """Mean over frames of 1 - cos(z(fake), z(real)): ``fake``/``real`` (B, N) audio, N a multiple of 320,
    both encoded by ``content_model`` (a ``ContentEncoder``) from its zero state; gradients flow through
    the ``fake`` side only. ``layers``: plus, for each residual layer of the encoder, the L1 distance of its
    outputs divided by the mean magnitude of the target's (a deep-feature loss: the hidden layers keep
    more of the acoustic detail than ``z``), averaged over the layers."""
    import torch

    state = content_model.init_state(fake.shape[0])
    state = tuple(s.to(fake.device) for s in state)
    hidden: list = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: hidden.append(out[0])) for m in content_model.res] \
        if layers else []
    try:
        with torch.no_grad():
            z_real = content_model(real, *state)[1]
        h_real, hidden[:] = list(hidden), []
        z_fake = content_model(fake, *state)[1]
    finally:
        for h in hooks:
            h.remove()
    loss = (1.0 - torch.nn.functional.cosine_similarity(z_fake, z_real, dim=-1)).mean()
    if layers:
        loss = loss + sum((a - b).abs().mean() / (b.abs().mean() + 1e-6) for a, b in zip(hidden, h_real)) / len(h_real)
    return loss


class ConversionTargets(Protocol):
    def __call__(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` voices to convert to: embeddings (n, D) float32 and median F0 in Hz (n,)."""
        ...


@dataclass
class PseudoSpeakerTargets:
    """Conversion targets drawn as the method draws a session's voice: ``identities`` is an
    :class:`rtanon.identity.speaker.IdentityModel`, ``strategy`` its pseudo-speaker strategy."""

    identities: object
    strategy: str = "gmm"

    def __call__(self, rng, n):
        voices = [self.identities.new_identity(self.strategy, rng=rng) for _ in range(n)]
        return (np.stack([v.embedding for v in voices]).astype(np.float32),
                np.array([v.median_f0_hz for v in voices], np.float32))


def shift_f0_to_median(f0_hz: np.ndarray, median_hz: np.ndarray) -> np.ndarray:
    """Each row of ``f0_hz`` (B, F; 0 = unvoiced) scaled so that its voiced median becomes ``median_hz[b]``
    (a shift in log-F0, as a session's pitch mapping does on average); rows without voiced frames stay."""
    out = f0_hz.copy()
    for b in range(len(out)):
        voiced = out[b] > 0
        if voiced.any():
            out[b, voiced] = np.clip(out[b, voiced] * (median_hz[b] / np.median(out[b, voiced])), 40.0, 600.0)
    return out


def _atomic_save(obj, path: Path) -> None:
    import torch

    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_generator(path: str | Path, device: str = "cpu"):
    """A generator from a ``generator.pt`` checkpoint (weights, config, step), in eval mode."""
    import torch

    from rtanon.neural.vocoder import CausalNsfHifiGan, VocoderConfig

    def tuplify(v):
        return tuple(tuplify(x) for x in v) if isinstance(v, (list, tuple)) else v

    ckpt = torch.load(path, map_location=device, weights_only=True)
    saved = {"prenet_dilations": (), "aux_mel_bins": 0, **ckpt["config"]}  # checkpoints from before the pre-net
    cfg = VocoderConfig(**{k: tuplify(v) for k, v in saved.items()})
    model = CausalNsfHifiGan(cfg).to(device)
    model.load_state_dict(ckpt["generator"])
    return model.eval()


def warm_start(path: str | Path, vocoder_config) -> dict:
    """A ``generator.pt`` checkpoint for ``vocoder_config`` from the weights at ``path``, which may lack the
    pre-net and its mel head (a checkpoint from before them): the missing residual pre-net convolutions start
    at zero (weight-norm gain 0), so the new model computes what the old one did; training then grows them.
    Pre-net convolutions the checkpoint has keep their weights. An input log-mel convolution
    (``input_mel_bins``) the checkpoint lacks starts at zero the same way. Every other weight must match
    in shape."""
    import torch

    from rtanon.neural.vocoder import CausalNsfHifiGan

    old = load_generator(path)
    model = CausalNsfHifiGan(vocoder_config)
    try:
        missing, unexpected = model.load_state_dict(old.state_dict(), strict=False)
    except RuntimeError as exc:  # a shape mismatch
        raise ConfigError(f"{path} does not fit the vocoder config: {str(exc).splitlines()[-1].strip()}") from None
    new_parts = ("prenet.", "mel_head.", "mel_in.")
    if unexpected or any(not k.startswith(new_parts) for k in missing):
        raise ConfigError(f"{path} does not fit the vocoder config: missing {missing[:4]}, unexpected "
                          f"{unexpected[:4]}; only the pre-net, its mel head and the input log-mel convolution "
                          "may be new")
    new_convs = [(f"prenet.{i}.", conv) for i, conv in enumerate(model.prenet)]
    if model.mel_in is not None:
        new_convs.append(("mel_in.", model.mel_in))
    with torch.no_grad():
        for prefix, conv in new_convs:
            if not any(k.startswith(prefix) for k in missing):
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
                  speaker_augment: SpeakerAugment | None = None,
                  on_log: Callable[[dict], None] | None = None, max_minutes: float | None = None,
                  content_model=None, conversion_targets: ConversionTargets | None = None,
                  speaker_model=None) -> dict:
    """Trains (or resumes training of) the vocoder until ``config.steps`` (or ``max_steps`` more steps
    in this call, or until ``max_minutes`` of wall clock, with a checkpoint). Returns the last log record. See the module docstring for the run directory.

    ``content_model``: the torch ``ContentEncoder`` whose ``z`` fills the shards (``rtanon.content.train.
    load_checkpoint``), needed when ``config.content_loss_weight`` or ``converted_content_weight`` > 0; it
    is frozen here. ``conversion_targets`` (e.g. :class:`PseudoSpeakerTargets`): the voices of the
    converted-voice losses, needed when ``config.converted_content_weight`` or ``speaker_loss_weight`` > 0.
    ``speaker_model``: the frozen ``SpeakerEmbedder`` of the speaker loss (``rtanon.neural.speaker_loss.
    load_speaker_embedder``), needed when ``config.speaker_loss_weight`` > 0."""
    import torch

    from rtanon.neural.discriminators import Discriminators
    from rtanon.neural.losses import (
        MelLoss,
        MultiResolutionStftLoss,
        discriminator_loss,
        generator_loss,
    )
    from rtanon.neural.vocoder import CausalNsfHifiGan

    config.validate()
    if data.units_dim != config.vocoder.units_dim or data.embeddings.shape[1] != config.vocoder.speaker_dim:
        raise ConfigError(f"the shards hold units_dim={data.units_dim}, speaker_dim={data.embeddings.shape[1]}; "
                          f"the vocoder config expects {config.vocoder.units_dim} and {config.vocoder.speaker_dim}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    run_dir = Path(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_json(), indent=1, default=list))

    torch.manual_seed(config.seed)
    random.seed(config.seed)
    gen = CausalNsfHifiGan(config.vocoder).to(device)
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
    aux_mel = config.vocoder.aux_mel_bins > 0
    if aux_mel and mel_loss.mel.mel_basis.shape[0] != config.vocoder.aux_mel_bins:
        raise ConfigError(f"aux_mel_bins={config.vocoder.aux_mel_bins}; it must equal the mel loss's "
                          f"{mel_loss.mel.mel_basis.shape[0]} bands")
    stft_loss = MultiResolutionStftLoss().to(device) if config.use_stft_loss else None
    converted = config.converted_content_weight > 0 or config.speaker_loss_weight > 0
    if converted and conversion_targets is None:
        raise ConfigError("converted_content_weight or speaker_loss_weight > 0 needs conversion_targets (the voices "
                          "to convert to)")
    if config.speaker_loss_weight > 0:
        if speaker_model is None:
            raise ConfigError("speaker_loss_weight > 0 needs speaker_model (rtanon.neural.speaker_loss."
                              "load_speaker_embedder)")
        speaker_model = speaker_model.to(device).eval()
        speaker_model.requires_grad_(False)
        from rtanon.neural.speaker_loss import speaker_privacy_loss
    if config.content_loss_weight > 0 or config.converted_content_weight > 0:
        if content_model is None:
            raise ConfigError("a content loss needs the content encoder's torch weights (content_model)")
        content_model = content_model.to(device).eval()
        content_model.requires_grad_(False)

    step = 0
    gen_path, trainer_path = run_dir / "generator.pt", run_dir / "trainer.pt"
    if resume and gen_path.exists():
        g_ckpt = torch.load(gen_path, map_location=device, weights_only=True)
        gen.load_state_dict(g_ckpt["generator"])
        step = int(g_ckpt["step"])
        if trainer_path.exists():
            t_ckpt = torch.load(trainer_path, map_location=device, weights_only=False)
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
        _atomic_save(g_state, gen_path)
        _atomic_save({"step": step, "discriminators": disc.state_dict(), "opt_g": opt_g.state_dict(),
                      "opt_d": opt_d.state_dict(), "sched_g": sched_g.state_dict(), "sched_d": sched_d.state_dict(),
                      "scaler": scaler.state_dict(), "torch_rng": torch.get_rng_state()}, trainer_path)
        _atomic_save(g_state, run_dir / "checkpoints" / f"generator_step{step:08d}.pt")
        old = sorted((run_dir / "checkpoints").glob("generator_step*.pt"))[:-config.keep_checkpoints]
        for p in old:
            p.unlink()

    end = config.steps if max_steps is None else min(config.steps, step + max_steps)
    ctx = config.context_frames * HOP_SAMPLES
    record: dict = {}
    if data.units_kind != config.vocoder.units_kind:
        raise ConfigError(f"the shards hold content {data.units_kind!r}, the vocoder config expects "
                          f"{config.vocoder.units_kind!r}; build shards of the right kind")
    if data.units_kind == "probs" and data.units_temperature != config.vocoder.units_temperature:
        raise ConfigError(f"the dataset's units are at temperature {data.units_temperature}, the vocoder config "
                          f"says {config.vocoder.units_temperature}; load the shards with "
                          "ShardDataset(..., units_temperature=config.vocoder.units_temperature)")
    log = open(run_dir / "train.log", "a")
    t_last = t_start = time.perf_counter()
    try:
        gen.train()
        disc.train()
        input_mel = config.vocoder.input_mel_bins
        if input_mel:
            from rtanon.neural.input_mel import perturbed_log_mel
        while step < end:
            rng = np.random.default_rng([config.seed, step])
            # one frame more than trained on: the input log-mel of the last frame reads 96 samples past it
            b = data.batch(rng, config.batch_size, config.segment_frames + (1 if input_mel else 0))
            if config.units_noise > 0:
                b["units"] = noisy_units(b["units"], config.units_noise, rng)
            if input_mel:
                s = config.segment_frames
                mel_frames = perturbed_log_mel(b["audio"], input_mel, s, rng)
                b = {"units": np.concatenate([b["units"][:, :s], mel_frames], axis=2), "f0_hz": b["f0_hz"][:, :2 * s],
                     "audio": b["audio"][:, :HOP_SAMPLES * s], "speaker": b["speaker"]}
            emb = data.embeddings[b["speaker"]]
            if speaker_augment is not None:
                emb = speaker_augment(emb, b["speaker"], data.embeddings, rng)
            noise = rng.standard_normal(b["audio"].shape, dtype=np.float32)
            units, f0, spk, noise_t, real = (torch.from_numpy(np.ascontiguousarray(a)).to(device)
                                             for a in (b["units"], b["f0_hz"], emb, noise, b["audio"]))
            real = real[:, None, ctx:]
            adversarial = step >= config.adversarial_start_step
            residual = config.vocoder.source_type != "envelope" or step >= config.residual_start_step
            with torch.autocast("cuda", dtype=amp_dtype, enabled=use_amp):
                fake, mel_pred = gen.forward_with_mel(units, f0, spk, noise_t, residual=residual)
                fake = fake[:, None, ctx:]
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
            stft = stft_loss(fake, real) if stft_loss is not None else None
            g_loss, parts = generator_loss(mel, fake_scores, real_fmaps, fake_fmaps, stft)
            if config.content_loss_weight > 0:
                closs = content_consistency_loss(content_model, fake[:, 0], real[:, 0], config.content_loss_layers)
                g_loss = g_loss + config.content_loss_weight * closs
                parts["content"] = float(closs.detach())
                parts["total"] += config.content_loss_weight * parts["content"]
            if converted:  # the first h items again, in pseudo-speakers' voices: only the content must stay
                h = max(1, int(round(config.converted_fraction * config.batch_size)))
                emb_c, median_c = conversion_targets(rng, h)
                emb_c = torch.from_numpy(emb_c).to(device)
                f0_c = shift_f0_to_median(b["f0_hz"][:h], median_c)
                with torch.autocast("cuda", dtype=amp_dtype, enabled=use_amp):
                    fake_c, _ = gen.forward_with_mel(units[:h], torch.from_numpy(f0_c).to(device),
                                                     emb_c, noise_t[:h],
                                                     residual=residual and config.converted_pass == "output")
                fake_c = fake_c.float()[:, ctx:]
                if config.converted_content_weight > 0:
                    closs_c = content_consistency_loss(content_model, fake_c, real[:h, 0], config.content_loss_layers)
                    g_loss = g_loss + config.converted_content_weight * closs_c
                    parts["content_converted"] = float(closs_c.detach())
                    parts["total"] += config.converted_content_weight * parts["content_converted"]
                if config.speaker_loss_weight > 0:
                    sloss, cos_s, cos_t = speaker_privacy_loss(speaker_model, fake_c, real[:h, 0], emb_c)
                    g_loss = g_loss + config.speaker_loss_weight * sloss
                    parts["speaker"] = float(sloss.detach())
                    parts["total"] += config.speaker_loss_weight * parts["speaker"]
                    parts["cos_source"], parts["cos_target"] = cos_s, cos_t
            if aux_mel:  # frame k of the head is the mel frame centred on sample 160 k of the segment
                with torch.no_grad():
                    target = mel_loss.mel(real[:, 0])  # frames centred on ctx + 160 k
                k0 = 2 * config.context_frames
                pred = mel_pred.float()[:, :, k0:k0 + target.shape[2]]
                aux = torch.nn.functional.l1_loss(pred, target[:, :, :pred.shape[2]])
                g_loss = g_loss + config.aux_mel_weight * aux
                parts["aux_mel"] = float(aux.detach())
                parts["total"] += config.aux_mel_weight * parts["aux_mel"]
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

            if step % config.log_every == 0 or step == end:
                now = time.perf_counter()
                record = {"step": step, **{f"g_{k}": round(v, 5) for k, v in parts.items()},
                          "d_total": round(d_loss_value, 5), "grad_norm_g": round(grad_norm, 3),
                          "lr": sched_g.get_last_lr()[0], "sec_per_step": round((now - t_last) / config.log_every, 4),
                          "device": device}
                t_last = now
                log.write(json.dumps(record) + "\n")
                log.flush()
                if on_log:
                    on_log(record)
            out_of_time = max_minutes is not None and time.perf_counter() - t_start > 60.0 * max_minutes
            if step % config.checkpoint_every == 0 or step == end or out_of_time:
                save(step)
            if out_of_time:
                break
    finally:
        log.close()
    return record


def main(argv: list[str] | None = None) -> None:
    """``python -m rtanon.neural.train --shards DIR --run DIR [...]``: train or resume (see --help)."""
    import argparse
    from dataclasses import replace

    from rtanon.neural.discriminators import DiscriminatorConfig
    from rtanon.neural.vocoder import VocoderConfig

    ap = argparse.ArgumentParser(prog="python -m rtanon.neural.train",
                                 description="Train (or resume training of) the causal HiFi-GAN vocoder "
                                             "on feature shards.")
    ap.add_argument("--shards", required=True, help="shard directory (manifest.json, speakers.npz, shard_*.npz)")
    ap.add_argument("--shard-files", help="comma-separated shard files to load (default: all present)")
    ap.add_argument("--run", required=True, help="run directory (checkpoints, train.log)")
    ap.add_argument("--steps", type=int, default=TrainConfig.steps, help="total steps of the run")
    ap.add_argument("--max-steps", type=int, help="stop after this many more steps in this call")
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    ap.add_argument("--segment-frames", type=int, default=TrainConfig.segment_frames)
    ap.add_argument("--context-frames", type=int, default=TrainConfig.context_frames)
    ap.add_argument("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every)
    ap.add_argument("--log-every", type=int, default=TrainConfig.log_every)
    ap.add_argument("--adversarial-start-step", type=int, default=TrainConfig.adversarial_start_step)
    ap.add_argument("--residual-start-step", type=int, default=TrainConfig.residual_start_step)
    ap.add_argument("--vocoder-config", default="{}", help="VocoderConfig fields as JSON (units_dim and "
                                                          "speaker_dim come from the shards)")
    ap.add_argument("--discriminator-config", default="{}", help="DiscriminatorConfig fields as JSON")
    ap.add_argument("--blend-prob", type=float, default=0.0, help="embedding-blending probability (0 = off)")
    ap.add_argument("--units-temperature", type=float, default=0.05,
                    help="Eq. 1 temperature the soft units are sharpened to (the content encoder's default for "
                         "the neural method; 0.1 = as stored)")
    ap.add_argument("--learning-rate", type=float, default=TrainConfig.learning_rate)
    ap.add_argument("--max-minutes", type=float, help="stop (with a checkpoint) after this many minutes")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=TrainConfig.seed)
    a = ap.parse_args(argv)

    def tuplify(v):
        return tuple(tuplify(x) for x in v) if isinstance(v, list) else v

    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    data = ShardDataset(a.shards, a.shard_files.split(",") if a.shard_files else None,
                        units_temperature=a.units_temperature)
    vkw = {k: tuplify(v) for k, v in json.loads(a.vocoder_config).items()}
    vkw.update(units_dim=data.units_dim, speaker_dim=int(data.embeddings.shape[1]),
               units_temperature=data.units_temperature, units_kind=data.units_kind)
    dkw = {k: tuplify(v) for k, v in json.loads(a.discriminator_config).items()}
    config = replace(TrainConfig(), vocoder=VocoderConfig(**vkw), discriminators=DiscriminatorConfig(**dkw),
                     steps=a.steps, batch_size=a.batch_size, segment_frames=a.segment_frames,
                     context_frames=a.context_frames,
                     checkpoint_every=a.checkpoint_every, log_every=a.log_every,
                     adversarial_start_step=a.adversarial_start_step, seed=a.seed,
                     residual_start_step=a.residual_start_step,
                     learning_rate=a.learning_rate)
    print(f"{len(data)} utterances, {data.total_seconds / 3600:.2f} h from {len(data.shard_files)} shard(s); "
          f"{data.embeddings.shape[0]} speakers", flush=True)
    augment = BlendWithOtherSpeaker(prob=a.blend_prob) if a.blend_prob > 0 else None
    last = train_vocoder(config, data, a.run, device=a.device, max_steps=a.max_steps, speaker_augment=augment,
                         on_log=lambda r: print(json.dumps(r), flush=True), max_minutes=a.max_minutes)
    print(f"stopped at step {last.get('step')}; generator: {Path(a.run) / 'generator.pt'}")


if __name__ == "__main__":
    main()
