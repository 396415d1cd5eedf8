"""``rtanon f0-bench``: accuracy, parity and speed of the F0 tracker (prints a markdown table)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "f0-bench", help="benchmark the F0 tracker against pYAAPT, harvest and Praat (markdown table)",
        description="Tracks F0 on N files each of so762_dev and libri_clips with rtanon's C++ and Numba "
                    "kernels, pYAAPT (the reference, amfm-decompy), pyworld harvest and Praat (parselmouth, "
                    "GPL: used here only, never by rtanon itself); prints gross pitch error and voicing "
                    "decision error against pYAAPT, C++/Numba parity, batch speed against pYAAPT measured "
                    "in the same run, and the streaming cost per chunk. Needs the [eval] references: "
                    "pip install amfm-decompy pyworld-prebuilt praat-parselmouth.")
    p.add_argument("--data", default="../shared/data", metavar="DIR",
                   help="folder holding so762_dev/ and libri_clips/ (default: ../shared/data)")
    p.add_argument("--files", type=int, default=0, metavar="N",
                   help="files per corpus, evenly spaced (default 0: every file, about 6 CPU-minutes with pYAAPT "
                        "alone; a 10-file sample takes a minute but its GPE swings by several points with a "
                        "single hard file)")
    p.add_argument("--references", choices=("all", "yaapt"), default="yaapt",
                   help="only pYAAPT, the reference of every GPE/VDE and speed figure (yaapt, default), or also "
                        "pyworld harvest and Praat (all: about 3x slower over every file; try --files 40)")
    p.add_argument("--chunk-ms", type=int, default=20, choices=(10, 20, 40), help="streaming chunk (default 20)")
    p.add_argument("--decision-lag", type=int, default=None, metavar="FRAMES",
                   help="override the fixed-lag decoder's lag (frames of 10 ms; adds to the lookahead)")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys
    from dataclasses import replace
    from pathlib import Path

    from rtanon.errors import CliError
    from rtanon.f0.bench import format_report, run_benchmark
    from rtanon.f0.config import F0Config

    try:
        import amfm_decompy  # noqa: F401
    except ImportError:
        raise CliError("the reference tracker pYAAPT is missing: pip install amfm-decompy") from None
    data = Path(args.data)
    if not (data / "so762_dev").is_dir() or not (data / "libri_clips").is_dir():
        raise CliError(f"{data}: expected so762_dev/ and libri_clips/ inside; pass --data DIR")
    if args.files < 0:
        raise CliError("--files must be >= 0 (0: every file)")
    config = F0Config()
    if args.decision_lag is not None:
        config = replace(config, decision_lag_frames=args.decision_lag)
    config.validate()
    rep = run_benchmark(data, args.files, config, args.chunk_ms,
                        progress=lambda s: print(s, file=sys.stderr, flush=True),
                        other_references=args.references == "all")
    print(format_report(rep, config, args.chunk_ms))
    return 0
