"""``rtanon identity new|show|report|search``: pseudo-speaker identities."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    from rtanon.identity.select import DISTANCES, GENDER_CHOICES, PROXIMITIES

    p = sub.add_parser("identity", help="make, show and evaluate pseudo-speaker identities",
                       description="A pseudo-speaker is the voice listeners hear: an embedding plus an F0 "
                                   "target. By default every session draws a fresh one; `identity new` makes "
                                   "one on purpose, to pin it with --identity FILE.")
    ps = p.add_subparsers(dest="identity_command", metavar="ACTION", required=True)
    n = ps.add_parser("new", help="make a pseudo-speaker and write it as JSON",
                      description="Strategies: random/near/far/dense/sparse average N* pool speakers "
                                  "(Srivastava et al., 'Privacy and utility of x-vector based speaker "
                                  "anonymization', 2022); gmm samples a new voice from a PCA+GMM of the pool "
                                  "(Turner et al., 'Generating identities with mixture models for speaker "
                                  "anonymization', 2022). near, far, "
                                  "forced dissimilarity and --gender same/opposite need your voice: --enroll WAV "
                                  "(used in memory only; your embedding is never written).")
    n.add_argument("--strategy", default="gmm", choices=PROXIMITIES + ("gmm",), help="default: gmm")
    n.add_argument("--distance", default="cosine", choices=DISTANCES,
                   help="distance for near/far/dense/sparse (default: cosine)")
    n.add_argument("--gender", default="random", choices=GENDER_CHOICES, help="pool gender (default: random)")
    n.add_argument("--enroll", nargs="+", metavar="WAV", help="recording(s) of the user's voice")
    n.add_argument("--user-gender", choices=("m", "f"), help="the user's gender (else inferred from --enroll)")
    n.add_argument("--assignment", default="speaker", choices=("speaker", "utterance"),
                   help="speaker: one identity from all --enroll files; utterance: one per file, written "
                        "as OUT-1.json, OUT-2.json, ... (default: speaker)")
    n.add_argument("--theta-fd", type=float, default=None,
                   help="gmm forced dissimilarity: max cosine to the user's voice (default 0.75 with --enroll)")
    n.add_argument("--pool", metavar="FILE", help="speaker pool file (default: the shipped pool)")
    n.add_argument("--seed", type=int, default=None, help="reproducible identity (default: OS random source)")
    n.add_argument("--out", required=True, metavar="FILE", help="identity JSON to write")
    n.set_defaults(func=run_new)
    s = ps.add_parser("show", help="describe an identity file")
    s.add_argument("file", metavar="FILE")
    s.set_defaults(func=run_show)
    r = ps.add_parser("report", help="diversity of each strategy's identities vs real voices (Turner et al. "
                                     "2022, Fig. 2)")
    r.add_argument("-n", type=int, default=200, help="identities per strategy (default: 200)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--pool", metavar="FILE")
    r.set_defaults(func=run_report)
    h = ps.add_parser("search", help="Turner et al. 2022's hyper-parameter search: KS and entropy over PCA "
                                     "variance x GMM size")
    h.add_argument("--repeats", type=int, default=3, help="random 50/50 splits averaged (default: 3)")
    h.add_argument("--pool", metavar="FILE")
    h.set_defaults(func=run_search)


def _pool(args):
    from rtanon.errors import CliError
    from rtanon.identity.pool import PoolError, SpeakerPool

    try:
        return SpeakerPool.load(args.pool) if args.pool else SpeakerPool.load_default()
    except PoolError as exc:
        raise CliError(str(exc)) from None


def run_new(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    from rtanon.errors import CliError
    from rtanon.identity.speaker import NEEDS_USER, IdentityError, IdentityModel, assign_identities

    out = Path(args.out)
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise CliError(f"--out {out}: folder {out.parent} does not exist; create it first")
    if args.theta_fd is not None and not -1.0 < args.theta_fd <= 1.0:
        raise CliError(f"--theta-fd {args.theta_fd}: a cosine similarity above -1 and at most 1 (default 0.75; "
                       "lower keeps the voice further from yours, 1 disables the check)")
    model = IdentityModel(_pool(args))
    rng = np.random.default_rng(args.seed)
    kw = dict(strategy=args.strategy, distance=args.distance, gender=args.gender, user_gender=args.user_gender,
              theta_fd=args.theta_fd, rng=rng)
    try:
        if args.enroll:
            from rtanon.io.audio import read_audio
            from rtanon.identity.encoder import make_encoder

            try:
                enc = make_encoder()
            except ImportError as exc:  # a missing tool: exit 2 with the install line
                raise CliError(f"--enroll: {exc}") from None
            user = np.stack([_embed(enc, read_audio(w), w) for w in args.enroll])  # in memory only
            identities = assign_identities(model, user, args.assignment, **kw)
            del user
        else:
            if args.strategy in NEEDS_USER:
                raise CliError(f"--strategy {args.strategy} needs your voice: add --enroll WAV")
            identities = [model.new_identity(**kw)]
    except IdentityError as exc:
        raise CliError(str(exc)) from None
    paths = [out] if len(identities) == 1 else [out.with_name(f"{out.stem}-{i + 1}{out.suffix or '.json'}")
                                                for i in range(len(identities))]
    for ident, path in zip(identities, paths):
        ident.save(path)
        print(f"wrote {path}: {_describe(ident)}")
    return 0


def _embed(encoder, audio, path: str):
    from rtanon.errors import CliError

    try:
        return encoder.embed(audio)
    except ValueError as exc:  # too short, silent
        raise CliError(f"--enroll {path}: {exc}") from None


def _describe(ident) -> str:
    """One line; the fields of a file (which anyone may have written) escaped and cut short."""
    import numpy as np

    from rtanon.paths import printable

    s = ident.strategy
    extra = ", ".join(f"{printable(k, 40)}={printable(v, 80)}" for k, v in list(s.items())[:20]
                      if k not in ("name",) and v is not None)
    q = ident.f0_quantiles_hz
    lv = np.asarray(ident.quantile_levels)
    p5, p50, p95 = (float(np.interp(x, lv, q)) for x in (0.05, 0.5, 0.95))
    return (f"{printable(s.get('name'), 40)} ({extra}), gender {printable(ident.gender, 20)}, F0 median "
            f"{p50:.0f} Hz (5-95 %: {p5:.0f}-{p95:.0f} Hz), {ident.embedding.shape[0]}-dim "
            f"{printable(ident.encoder, 80)} embedding")


def run_show(args) -> int:
    from rtanon.errors import CliError
    from rtanon.identity.speaker import IdentityError, PseudoSpeaker
    from rtanon.paths import printable

    try:
        ident = PseudoSpeaker.load(args.file)
    except IdentityError as exc:
        raise CliError(str(exc)) from None
    print(f"{printable(args.file)}: {_describe(ident)}; created {printable(ident.created_utc, 40)}")
    return 0


def run_report(args) -> int:
    from rtanon.identity.report import diversity_report, format_diversity

    pool = _pool(args)
    rows = diversity_report(pool, n=args.n, seed=args.seed)
    print(f"Diversity of {args.n} identities per strategy; pool split 50/50 per gender (seed {args.seed}): "
          f"strategies use the train half, users and the reference distribution come from the test half.")
    print(format_diversity(rows))
    return 0


def run_search(args) -> int:
    from rtanon.identity.generate import GmmConfig
    from rtanon.identity.report import choose, format_pitch_weight, format_search, search_gmm, search_pitch_weight

    pool = _pool(args)
    d = GmmConfig()
    print(f"Paper 003 Sec. 3.4 on our pool: per gender, PCA+GMM fitted on a random half of the speakers "
          f"(pitch weight {d.pitch_weight}), 2000 samples for the entropy, 400 for the KS against the other "
          f"half; mean ± sd over {args.repeats} splits.")
    rows = search_gmm(pool, repeats=args.repeats)
    print(format_search(rows))
    v, k = choose(rows)
    print(f"chosen: PCA variance {v}, {k} GMM component(s) (lowest KS averaged over genders among the "
          f"configurations whose identities are not closer to a training speaker than real held-out voices "
          f"are, +0.02; ties within 0.005 to fewer components, then less variance). GmmConfig default: "
          f"PCA variance {d.pca_variance}, {d.n_components} component(s).")
    print("\nJoint voice + pitch model: share of the joint vector's variance given to the log-F0 quantiles "
          "(0 = Turner et al. 2022, pitch not modelled: every identity gets the gender's mean pitch).")
    print(format_pitch_weight(search_pitch_weight(pool, repeats=args.repeats)))
    return 0
