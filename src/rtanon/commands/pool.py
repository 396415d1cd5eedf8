"""``rtanon pool build|info``: (re)build or inspect a speaker pool file."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("pool", help="build or inspect the speaker pool pseudo-voices are made from",
                       description="The speaker pool holds one embedding, gender, age and F0 quantiles per "
                                   "real speaker of Kaldi-style directories. rtanon ships one (see "
                                   "rtanon/models/speaker_pool.md); `pool build` makes a new one.")
    ps = p.add_subparsers(dest="pool_command", metavar="ACTION", required=True)
    b = ps.add_parser("build", help="embed every utterance of Kaldi-style directories into a pool file",
                      description="Embed every utterance (speaker encoder) and track F0 for each speaker of "
                                  "the Kaldi-style directories (wav.scp, utt2spk, spk2gender, optional "
                                  "spk2age). Slow: run it with `nice -n 19` in the background.")
    b.add_argument("--data", nargs="+", required=True, metavar="DIR", help="Kaldi-style data directories")
    b.add_argument("--out", required=True, metavar="FILE", help="output pool file (.npz)")
    b.add_argument("--encoder", default="resemblyzer", help="speaker encoder (default: resemblyzer)")
    b.add_argument("--f0-tracker", default="auto", choices=("auto", "rtanon", "pyworld-harvest", "pyaapt"),
                   help="F0 tracker: auto uses rtanon.f0 when present, else pyworld Harvest")
    b.add_argument("--f0-max-seconds", type=float, default=5.0,
                   help="audio per speaker used for the F0 quantiles (default: 5 s)")
    b.add_argument("--jobs", type=int, default=1, help="worker processes (default: 1)")
    b.add_argument("--max-speakers", type=int, default=None, help="first N speakers per directory (tests)")
    b.set_defaults(func=run_build)
    i = ps.add_parser("info", help="summarise a pool file (default: the shipped one)")
    i.add_argument("file", nargs="?", default=None, metavar="FILE")
    i.set_defaults(func=run_info)


def run_build(args) -> int:
    import torch

    from rtanon.identity.pool import build_pool

    torch.set_num_threads(1)
    pool = build_pool(args.data, args.encoder, f0_tracker=args.f0_tracker, jobs=args.jobs,
                      f0_max_seconds_per_speaker=args.f0_max_seconds, max_speakers=args.max_speakers)
    pool.save(args.out)
    print(f"wrote {args.out}: {len(pool)} speakers, {pool.utt_embeddings.shape[0]} utterances, "
          f"encoder {pool.meta['encoder']}, F0 tracker {pool.meta['f0_tracker']}")
    return 0


def run_info(args) -> int:
    import numpy as np

    from rtanon.errors import CliError
    from rtanon.identity.pool import PoolError, SpeakerPool

    try:
        pool = SpeakerPool.load(args.file) if args.file else SpeakerPool.load_default()
    except PoolError as exc:
        raise CliError(str(exc)) from None
    m = pool.meta
    print(f"pool: {len(pool)} speakers ({int((pool.genders == 'f').sum())} f / {int((pool.genders == 'm').sum())} m), "
          f"{pool.utt_embeddings.shape[0]} utterances, {pool.dim}-dim {m.get('encoder')} embeddings, "
          f"F0 tracker {m.get('f0_tracker')}, format v{m.get('format_version')}, built {m.get('created_utc')}")
    for c in np.unique(pool.corpora):
        sel = pool.corpora == c
        print(f"  {c}: {int(sel.sum())} speakers")
    for g in ("f", "m"):
        sel = pool.genders == g
        med = pool.f0_quantiles_hz[sel, 50]
        print(f"  {g}: median F0 across speakers {np.median(med):.0f} Hz (speaker medians {med.min():.0f}-{med.max():.0f} Hz)")
    return 0
