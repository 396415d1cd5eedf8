"""``rtanon file IN OUT``: anonymize one audio file with the streaming engine."""

from __future__ import annotations

from rtanon.commands._common import (add_context_arg, add_engine_args, add_seed_arg, anonymizer_from_args,
                                     identity_from_args)


def register(sub) -> None:
    p = sub.add_parser(
        "file", help="anonymize an audio file (same engine, chunk by chunk, as live)",
        description="Anonymize IN into OUT with the streaming engine, chunk by chunk, so the result is "
                    "exactly what `rtanon live` would play (without its delay); with --context utterance the "
                    "content is read from the whole file first (fewer lost words; no live stream can do "
                    "that). OUT has IN's sample rate and length, mono; it is written atomically and IN is "
                    "never modified. Any rate, channel count and sample format libsndfile reads is accepted; "
                    "with --context causal long files stream in constant memory.")
    p.add_argument("input", metavar="IN", help="input audio file (wav, flac, ogg, mp3: what libsndfile reads)")
    p.add_argument("output", metavar="OUT", help="output audio file; format from the extension (.wav, .flac, .ogg, .mp3)")
    add_engine_args(p)
    add_context_arg(p)
    add_seed_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from tqdm import tqdm

    from rtanon.io.audio import anonymize_file, check_output, probe
    from rtanon.methods import voice_sentence

    info = probe(args.input)
    check_output(args.output, info.path)  # before the models load: a bad output is a quick error
    session = anonymizer_from_args(args).open_session(seed=args.seed, identity=identity_from_args(args))
    with tqdm(total=round(info.seconds, 1), unit="s", desc="anonymizing", disable=info.seconds < 30,
              file=sys.stderr) as bar:
        anonymize_file(session, args.input, args.output, progress=lambda s: bar.update(round(s, 2)))
    c = session.counters
    print(f"wrote {args.output}: {info.seconds:.2f} s at {info.sample_rate_hz} Hz, voice: {voice_sentence(session.voice)}, "
          f"speech chunks {c.speech_chunks}/{c.chunks}, stage errors {c.stage_errors}")
    return 0
