"""``rtanon anonymize-dir``: anonymize a Kaldi-style corpus directory."""

from __future__ import annotations

from rtanon.commands._common import add_engine_args, add_seed_arg, anonymizer_from_args, identity_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "anonymize-dir", help="anonymize a Kaldi-style directory (wav.scp, utt2spk, spk2gender)",
        description="Writes DIR/<utt-id>.wav for every utterance of KALDI_DIR, plus wav.scp, utt2spk, "
                    "spk2gender (and spk2age, text when present), so DIR is a Kaldi-style directory too.")
    p.add_argument("--data", required=True, metavar="KALDI_DIR", help="input directory")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--assignment", choices=("speaker", "utterance"), default="speaker",
                   help="one pseudo-voice per original speaker (default) or per utterance")
    add_engine_args(p)
    add_seed_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from rtanon.corpus import anonymize_dir

    out = anonymize_dir(anonymizer_from_args(args), args.data, args.out,
                        assignment=args.assignment, seed=args.seed,
                        identity=identity_from_args(args))
    print(f"wrote {len(out.wav)} utterances of {len(out.speakers)} speakers to {out.root}")
    return 0
