"""``rtanon demo``: anonymize the embedded speech sample (the first thing to run)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="anonymize the embedded speech sample and print the latency figures",
        description="Runs the default method on a short embedded speech sample (synthesized with "
                    "espeak-ng), writes the original and the anonymized version side by side, and "
                    "prints the algorithmic latency and compute cost. Needs no microphone.")
    p.add_argument("--out", default="rtanon-demo.wav", help="anonymized output (default: rtanon-demo.wav); "
                   "the original is written beside it as *-original.wav")
    from rtanon.commands._common import add_engine_args, add_seed_arg

    add_engine_args(p)
    add_seed_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import time
    from pathlib import Path

    import numpy as np

    from rtanon.io.audio import AudioWriter, check_output, read_audio
    from rtanon.commands._common import anonymizer_from_args, identity_from_args, invoked_as
    from rtanon.config import SAMPLE_RATE_HZ
    from rtanon.methods import voice_sentence
    from rtanon.io.resources import demo_speech_path

    out = Path(args.out)
    orig = out.with_name(out.stem + "-original" + out.suffix)
    for path in (orig, out):
        check_output(path)  # before the models load
    with demo_speech_path() as src:
        x = read_audio(src)
    session = anonymizer_from_args(args).open_session(seed=args.seed, identity=identity_from_args(args))
    t0 = time.perf_counter()
    y = session.process_signal(x)
    seconds = time.perf_counter() - t0
    for path, sig in ((orig, x), (out, y)):
        with AudioWriter(path) as w:
            w.write(sig)
    audio_s = len(x) / SAMPLE_RATE_HZ
    corr = float(np.corrcoef(x, y)[0, 1])
    print(f"method {args.method}, voice: {voice_sentence(session.voice)}")
    print(f"wrote {out} (anonymized) and {orig} (original), {audio_s:.2f} s each")
    print(f"algorithmic latency {1000 * session.algorithmic_latency_samples / SAMPLE_RATE_HZ:.1f} ms, "
          f"real-time factor {seconds / audio_s:.3f}, waveform correlation with the original {corr:+.2f}")
    rtanon = invoked_as()
    print(f"next: `{rtanon} virtual-device create`, then `{rtanon} live --input <mic> --output rtanon` "
          f"(`{rtanon} devices` names your microphone)")
    return 0
