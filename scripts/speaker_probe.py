"""Training-domain privacy probe of vocoder checkpoints: how much of the source speaker a converted voice keeps.

Renders fixed training segments (``--batches`` x 16, seeds fixed) in fresh pseudo-voices, drawn as the
neural method draws one (F0 moved to the voice's median), and prints the mean resemblyzer cosine of the
output to the source segment (lower = less of the source speaker) and to the pseudo-speaker's embedding.
The same segments, voices and noise for every checkpoint, so checkpoints compare directly. It reads
training speakers through the model a speaker loss trains against: a quick guide between checkpoints,
not a privacy figure (``rtanon eval``'s attacker is another model). It also prints the share of 10 ms
frames that ``rtanon eval``'s reference F0 tracker finds voiced in the output against the source: a
speaker loss can hide a voice by making it breathy, which costs rho_F0 and intelligibility.

    PYTHONPATH=src python scripts/speaker_probe.py --shards runs/vCtl/shards \\
        src/rtanon/models/neural/generator.pt runs/vX/checkpoints/generator_step00024000.pt
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+", help="generator.pt files (rtanon train vocoder's)")
    ap.add_argument("--shards", required=True, help="feature shards the checkpoints were trained on")
    ap.add_argument("--batches", type=int, default=4, help="batches of 16 segments (default 4)")
    ap.add_argument("--segment-frames", type=int, default=40, help="20 ms frames per segment (default 40)")
    args = ap.parse_args()

    import torch

    from rtanon.eval.pitch import F0Tracker
    from rtanon.identity.speaker import IdentityModel
    from rtanon.neural.input_mel import perturbed_log_mel
    from rtanon.neural.rates import HOP_SAMPLES
    from rtanon.neural.speaker_loss import load_speaker_embedder, speaker_privacy_loss
    from rtanon.neural.train import PseudoSpeakerTargets, ShardDataset, load_generator, shift_f0_to_median

    data = ShardDataset(args.shards)
    embedder = load_speaker_embedder()
    targets = PseudoSpeakerTargets(IdentityModel())
    tracker = F0Tracker()
    s, skip = args.segment_frames, 4 * HOP_SAMPLES  # the first 4 frames start from the zero state
    for path in args.checkpoints:
        gen = load_generator(path).eval()
        bins = gen.config.input_mel_bins
        cos_source, cos_target, voiced_out, voiced_src = [], [], [], []
        for i in range(args.batches):
            rng = np.random.default_rng([123, i])
            b = data.batch(rng, 16, s + 1)
            units = b["units"][:, :s]
            if bins:
                units = np.concatenate([units, perturbed_log_mel(b["audio"], bins, s, rng)], axis=2)
            emb, median = targets(rng, 16)
            f0 = shift_f0_to_median(b["f0_hz"][:, :2 * s], median)
            noise = rng.standard_normal((16, HOP_SAMPLES * s), dtype=np.float32)
            with torch.no_grad():
                out, _ = gen.forward_with_mel(torch.from_numpy(np.ascontiguousarray(units)), torch.from_numpy(f0),
                                              torch.from_numpy(emb), torch.from_numpy(noise))
                _, c_s, c_t = speaker_privacy_loss(embedder, out[:, skip:],
                                                   torch.from_numpy(b["audio"][:, skip:HOP_SAMPLES * s]),
                                                   torch.from_numpy(emb))
            for y, x in zip(out[:, skip:].numpy(), b["audio"][:, skip:HOP_SAMPLES * s]):
                voiced_out.append(np.mean(tracker.track(y) > 0))
                voiced_src.append(np.mean(tracker.track(x) > 0))
            cos_source.append(c_s)
            cos_target.append(c_t)
        print(f"{path}: cosine to the source {np.mean(cos_source):.3f}, to the pseudo-speaker "
              f"{np.mean(cos_target):.3f}; voiced frames {np.mean(voiced_out):.3f} (source {np.mean(voiced_src):.3f})",
              flush=True)


if __name__ == "__main__":
    main()
