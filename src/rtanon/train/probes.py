"""Where does the neural voice lose intelligibility? Two probes on the vocoder's feature shards, and a
copy-synthesis WER.

    rtanon lab probe oracle --shards runs/vocoder/shards [--utt 2]
    rtanon lab probe units --shards runs/vocoder/shards [--shift 0]
    rtanon lab probe copysyn --data ../shared/data/so762_dev [--stride 5] \
        [--generator src/rtanon/models/neural/generator.pt] [--variants original,own,pseudo,own_f0pseudo]

``oracle``: how close can the envelope synthesiser (``rtanon.neural.vocoder.EnvelopeSynth``) get to one
real utterance when its two envelopes are free parameters per 10 ms frame, fitted by gradient descent with
the training losses (45 x mel L1 + MR-STFT)? Prints the log-mel L1 reached (the rendering's floor).

``units``: how much of the spectrum do the content units carry? A causal conv net (the vocoder pre-net's
shape: 6 residual layers at 256 channels) regresses 100 Hz log-mel frames from the content ``z`` plus the
speaker embedding on every third shard and reports the log-mel L1 on ``shard_00001`` (utterances it never
saw; its speakers may overlap the fitted shards'). ``--shift N`` gives the net N frames (20 ms each) of
lookahead.

``copysyn``: every ``stride``-th utterance of a Kaldi dir vocoded offline from its own content ``z`` and F0
(the packaged content encoder and F0 tracker) and transcribed with the evaluation's Whisper, in variants:
``own`` = the utterance's own resemblyzer embedding and F0 (what training reconstructs), ``pseudo`` = a
fresh pseudo-speaker (seed 1000 + index, as ``rtanon lab wer-paired`` draws them) with the F0 moved to its
median, ``own_f0pseudo`` = the own embedding with that moved F0, ``original`` = the input itself. The
output is scaled to the input's RMS. Separates what the content/vocoder path loses from what the change of
voice loses.

All run on one CPU thread in a few minutes. Shards: ``rtanon train vocoder`` writes them to OUT/shards.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rtanon.train.losses import MelLoss, MelSpectrogram, MultiResolutionStftLoss
from rtanon.train.shards import ShardDataset
from rtanon.neural.vocoder import EnvelopeSynth, VocoderConfig, _Slots


def oracle(args) -> None:
    cfg = VocoderConfig()
    data = ShardDataset(args.shards, ["shard_00000.npz"])
    f, t = int(data.offsets[args.utt]), int(data.frames[args.utt])
    target = torch.from_numpy(data.audio[320 * f:320 * (f + t)] / 32768.0).float()[None]
    f0 = torch.from_numpy(data.f0_hz[2 * f:2 * (f + t)])[None]
    slots = _Slots()
    synth = EnvelopeSynth(slots, cfg)
    m, frames = cfg.envelope_points, 2 * t
    env_h = torch.full((1, m, frames), -4.5, requires_grad=True)
    env_n = torch.full((1, m, frames), -5.5, requires_grad=True)
    opt = torch.optim.Adam([env_h, env_n], 0.05)
    mel_loss, stft_loss = MelLoss(), MultiResolutionStftLoss()
    noise = torch.randn(1, 160 * frames)
    for step in range(args.steps + 1):
        state = [torch.zeros(1, c, n) for c, n in slots.shapes]
        y = torch.tanh(synth(f0, env_h, env_n, noise, state, [None] * len(state)))[:, 0]
        mel = mel_loss(y, target)
        loss = 45.0 * mel + stft_loss(y, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"oracle step {step}: log-mel L1 {float(mel.detach()):.3f}", flush=True)


class _Regressor(nn.Module):
    def __init__(self, units_dim: int, speaker_dim: int, channels: int = 256,
                 dilations: tuple[int, ...] = (1, 2, 4, 8, 1, 1)) -> None:
        super().__init__()
        self.inp = nn.Conv1d(units_dim, channels, 5)
        self.spk = nn.Linear(speaker_dim, channels)
        self.dilations = dilations
        self.layers = nn.ModuleList(nn.Conv1d(channels, channels, 3, dilation=d) for d in dilations)
        self.out = nn.Conv1d(channels, 160, 1)

    def forward(self, units: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
        """units (B, T, K), speaker (B, S) -> log-mel (B, 80, 2T), causal."""
        x = self.inp(F.pad(units.transpose(1, 2), (4, 0))) + self.spk(speaker)[:, :, None]
        for layer, d in zip(self.layers, self.dilations):
            x = x + layer(F.pad(F.leaky_relu(x, 0.1), (2 * d, 0)))
        m = self.out(F.leaky_relu(x, 0.1))
        b = m.shape[0]
        return m.reshape(b, 2, 80, -1).permute(0, 2, 3, 1).reshape(b, 80, -1)


def units(args) -> None:
    fit = ShardDataset(args.shards, [f"shard_{i:05d}.npz" for i in range(0, 29, 3)])
    held = ShardDataset(args.shards, ["shard_00001.npz"])
    mel = MelSpectrogram()
    net = _Regressor(fit.units_dim, fit.embeddings.shape[1])
    opt = torch.optim.AdamW(net.parameters(), 1e-3)

    def loss_on(ds: ShardDataset, rng: np.random.Generator) -> torch.Tensor:
        b = ds.batch(rng, 32, 48)
        u = torch.from_numpy(b["units"])
        if args.shift:
            u = torch.cat((u[:, args.shift:], torch.zeros_like(u[:, :args.shift])), 1)
        target = mel(torch.from_numpy(b["audio"]))[:, :, :96]
        pred = net(u, torch.from_numpy(ds.embeddings[b["speaker"]]))[:, :, :target.shape[2]]
        return F.l1_loss(pred[:, :, 8:], target[:, :, 8:])

    t0 = time.perf_counter()
    for step in range(args.steps):
        loss = loss_on(fit, np.random.default_rng([1, step]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 250 == 0 or step == args.steps - 1:
            with torch.no_grad():
                h = np.mean([float(loss_on(held, np.random.default_rng([9, k]))) for k in range(10)])
            print(f"units step {step}: fitted {float(loss.detach()):.3f}, unseen utterances {h:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)


COPYSYN_VARIANTS = ("original", "own", "pseudo", "own_f0pseudo")


def shift_f0_to_median(f0_hz: np.ndarray, median_hz: np.ndarray) -> np.ndarray:
    """Each row of ``f0_hz`` (B, F; 0 = unvoiced) scaled so that its voiced median becomes ``median_hz[b]``
    (a shift in log-F0, as a session's pitch mapping does on average); rows without voiced frames stay."""
    out = f0_hz.copy()
    for b in range(len(out)):
        voiced = out[b] > 0
        if voiced.any():
            out[b, voiced] = np.clip(out[b, voiced] * (median_hz[b] / np.median(out[b, voiced])), 40.0, 600.0)
    return out


def copysyn(args) -> None:
    import soundfile as sf

    from rtanon.eval.asr import WhisperTranscriber
    from rtanon.eval.metrics import error_counts
    from rtanon.eval.textnorm import normalize
    from rtanon.identity.speaker import IdentityModel
    from rtanon.io.kaldi import KaldiDir
    from rtanon.train.shards import default_extractors
    from rtanon.neural.vocoder import load_generator

    variants = args.variants.split(",")
    unknown = set(variants) - set(COPYSYN_VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {COPYSYN_VARIANTS}")
    data = KaldiDir.load(args.data)
    utts = sorted(u for u in data.wav if u in data.text)
    extract = default_extractors()
    gen = load_generator(args.generator).eval()
    identities, asr = IdentityModel(), WhisperTranscriber()
    errors = {v: np.zeros(4, int) for v in variants}  # substitutions, deletions, insertions, words
    t0 = time.perf_counter()
    picked = range(0, len(utts), args.stride)
    for k in picked:
        x, sr = sf.read(data.wav[utts[k]], dtype="float32")
        if sr != 16000:
            raise SystemExit(f"{utts[k]}: {sr} Hz; this probe expects 16 kHz audio")
        x = x.mean(axis=1) if x.ndim > 1 else x
        z, f0 = extract.units(x), extract.f0_hz(x)
        t = min(len(z), len(f0) // 2)
        z, f0 = z[:t], f0[:2 * t]
        own = extract.speaker_embedding([x]).astype(np.float32)
        voice = identities.new_identity("gmm", rng=np.random.default_rng(1000 + k))
        f0_moved = shift_f0_to_median(f0[None], np.array([voice.median_f0_hz], np.float32))[0]
        ref = normalize(data.text[utts[k]])
        for v in variants:
            if v == "original":
                y = x
            else:
                emb = own if v.startswith("own") else voice.embedding.astype(np.float32)
                f = f0 if v == "own" else f0_moved
                noise = torch.randn(1, 320 * t, generator=torch.Generator().manual_seed(k))
                with torch.no_grad():
                    y = gen(torch.from_numpy(z[None]), torch.from_numpy(f[None].astype(np.float32)),
                            torch.from_numpy(emb[None]), noise)[0].numpy()
                y = y * (np.sqrt(np.mean(x[:len(y)] ** 2)) / max(1e-6, float(np.sqrt(np.mean(y ** 2)))))
            errors[v] += (*error_counts(ref, normalize(asr.transcribe(y))), len(ref))
    for v in variants:
        s, d, i, n = errors[v]
        print(f"copysyn {v}: {len(picked)} utterances, WER {100 * (s + d + i) / n:.1f} % (substitutions "
              f"{100 * s / n:.1f}, deletions {100 * d / n:.1f}, insertions {100 * i / n:.1f})")
    print(f"{time.perf_counter() - t0:.0f} s")


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="probe", required=True)
    p = sub.add_parser("oracle", help="the synthesiser's floor with free envelopes")
    p.add_argument("--shards", required=True)
    p.add_argument("--utt", type=int, default=2, help="utterance index in shard_00000 (default 2)")
    p.add_argument("--steps", type=int, default=300)
    p.set_defaults(func=oracle)
    p = sub.add_parser("units", help="log-mel regressed from the content units")
    p.add_argument("--shards", required=True)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--shift", type=int, default=0, help="frames of lookahead given to the regressor")
    p.set_defaults(func=units)
    p = sub.add_parser("copysyn", help="WER of offline vocoding with the own voice and with a pseudo-voice")
    p.add_argument("--data", required=True, help="Kaldi dir with text (e.g. ../shared/data/so762_dev)")
    p.add_argument("--stride", type=int, default=5, help="every N-th utterance in sorted order (default 5)")
    p.add_argument("--generator", default="src/rtanon/models/neural/generator.pt")
    p.add_argument("--variants", default=",".join(COPYSYN_VARIANTS), help=f"comma-separated, from {COPYSYN_VARIANTS}")
    p.set_defaults(func=copysyn)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.func(args)

