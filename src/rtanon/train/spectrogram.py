"""Spectrograms of an utterance and its anonymization, with rtanon's F0 track on both (for model cards).

    rtanon lab spectrogram-pair ../shared/data/so762_dev so000920002 out.png \
        [--method neural] [--seed 0] [--vocoder FILE]

The anonymization runs as `rtanon file` runs it (the engine's ``Session.process_signal``, fixed seed);
the picture is the only output (no audio is written).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="Kaldi-style directory (wav.scp, text)")
    ap.add_argument("utt", help="utterance id")
    ap.add_argument("out", type=Path, help="PNG to write")
    ap.add_argument("--method", default="neural")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocoder", default=None, help="vocoder ONNX (default: the packaged one)")
    args = ap.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rtanon.io.audio import read_audio
    from rtanon.config import AnonymizerConfig, NeuralConfig
    from rtanon.engine import Anonymizer
    from rtanon.f0.tracker import frame_times_s, track
    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(args.data)
    x = read_audio(kd.wav[args.utt])
    text = kd.text.get(args.utt, "")
    cfg = AnonymizerConfig(method=args.method, neural=NeuralConfig(vocoder_onnx=args.vocoder))
    y = Anonymizer(cfg).open_session(seed=args.seed).process_signal(x)
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for ax, sig, title in ((axes[0], x, f'original ({args.utt}, {args.data.name}): "{text}"'),
                           (axes[1], y, f"{args.method} (seed {args.seed})")):
        ax.specgram(sig, NFFT=512, Fs=16000, noverlap=512 - 80, cmap="magma", vmin=-140)
        f0 = track(sig)
        t = frame_times_s(len(f0))
        v = f0 > 0
        ax.plot(t[v], f0[v], ".", ms=2, color="c", label="rtanon F0")
        ax.set_ylim(0, 8000)
        ax.set_ylabel("Hz")
        ax.set_title(title, fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
    axes[1].set_xlabel("s")
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")
    return 0

