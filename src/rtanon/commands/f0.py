"""``rtanon f0 IN OUT.csv``: F0 track of an audio file, one row per 10 ms frame."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "f0", help="write the F0 track of an audio file as CSV (time_s,f0_hz; 0 = unvoiced)",
        description="Tracks the fundamental frequency of IN with rtanon's streaming YAAPT-style tracker "
                    "(the same kernel as live) and writes OUT as CSV with the header time_s,f0_hz and one "
                    "row per 10 ms frame; frame k is centred at k * 10 ms; 0 means unvoiced. IN may be any "
                    "rate or channel count libsndfile reads (it is mixed to mono and resampled to 16 kHz).")
    p.add_argument("input", metavar="IN", help="input audio file (wav, flac, ogg)")
    p.add_argument("output", metavar="OUT", help="output CSV file")
    p.add_argument("--kernel", default="auto", choices=["auto", "cpp", "numba"],
                   help="F0 kernel: cpp (native extension), numba (fallback), auto (cpp when built; default)")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from rtanon.atomic import atomic_open
    from rtanon.io.audio import probe, read_audio
    from rtanon.errors import CliError
    from rtanon.f0.tracker import frame_times_s, resolve_kernel, track

    info = probe(args.input)
    try:
        kernel = resolve_kernel(args.kernel)
    except ImportError as exc:
        raise CliError(str(exc)) from None
    f0 = track(read_audio(args.input), kernel=kernel)
    out = Path(args.output)
    if not out.parent.is_dir() and str(out.parent):
        raise CliError(f"{out}: folder {out.parent} does not exist")
    with atomic_open(out, "w", encoding="ascii") as f:
        f.write("time_s,f0_hz\n")
        for t, v in zip(frame_times_s(f0.shape[0]), f0):
            f.write(f"{t:.2f},{v:.2f}\n")
    voiced = int((f0 > 0).sum())
    print(f"wrote {out}: {f0.shape[0]} frames of 10 ms ({info.seconds:.2f} s), {voiced} voiced, kernel {kernel}")
    return 0
