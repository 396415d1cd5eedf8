"""Paired WER comparison of neural-method candidates, one fresh pseudo-voice per utterance.

``rtanon eval`` draws one pseudo-voice per speaker (40 on so762_dev), and its WER moves by several
points with that draw. This tool runs every utterance of a Kaldi dir through ``Session.process_signal``
(as ``rtanon file`` does) with a fresh voice each (seed ``--seed-base + i`` for the i-th utterance in
sorted order, so every system gets the same voices), transcribes with the evaluation's Whisper, and
writes per-utterance errors split into substitutions, deletions and insertions. ``compare`` then gives
the WER difference with a paired bootstrap over utterances, and again without the utterances on which
the ASR looped for either system (``rtanon.eval.metrics.asr_runaway``).

    rtanon lab wer-paired run ../shared/data/so762_dev runs/wer_shipped.json
    rtanon lab wer-paired run ../shared/data/so762_dev runs/wer_cand.json \\
        --vocoder runs/vX/vocoder.onnx
    rtanon lab wer-paired compare runs/wer_shipped.json runs/wer_cand.json

``from-eval`` writes the same per-utterance rows from the transcripts an ``rtanon eval`` run cached for
one of its systems (no rendering, no ASR), so two systems of one evaluation compare the same way:

    rtanon lab wer-paired from-eval runs/ev_X mcadams ../shared/data/so762_dev runs/ev_X_mcadams.json

``--content FILE`` runs another content encoder than the packaged one (with a vocoder trained on its
output). 320 utterances take about 6 minutes on one core here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from rtanon import atomic


def _row(utt: str, seed: int | None, reference: str, transcript: str) -> dict:
    """One utterance's result: normalised texts and its substitutions, deletions and insertions."""
    from rtanon.eval.metrics import error_counts
    from rtanon.eval.textnorm import normalize

    ref, hyp = normalize(reference), normalize(transcript)
    s, d, ins = error_counts(ref, hyp)
    return {"utt": utt, "seed": seed, "ref": " ".join(ref), "hyp": " ".join(hyp), "s": s, "d": d, "i": ins,
            "n": len(ref)}


def run(args) -> int:
    import soundfile as sf

    from rtanon.config import AnonymizerConfig, NeuralConfig
    from rtanon.engine import Anonymizer
    from rtanon.eval.asr import WhisperTranscriber
    from rtanon.io.kaldi import KaldiDir

    data = KaldiDir.load(args.data)
    utts = sorted(u for u in data.wav if u in data.text)
    neural = NeuralConfig(vocoder_onnx=args.vocoder, content_onnx=args.content)
    anonymizer = None if args.original else Anonymizer(AnonymizerConfig(method="neural", neural=neural))
    asr = WhisperTranscriber()
    rows, t0 = [], time.perf_counter()
    picked = range(0, len(utts), args.stride)
    for i, k in enumerate(picked):
        utt = utts[k]
        x, sr = sf.read(data.wav[utt], dtype="float32")
        if sr != 16000:
            raise SystemExit(f"{utt}: {sr} Hz; this script expects 16 kHz audio")
        x = x.mean(axis=1) if x.ndim > 1 else x
        y = x if anonymizer is None else anonymizer.open_session(seed=args.seed_base + k).process_signal(x)
        rows.append(_row(utt, args.seed_base + k, data.text[utt], asr.transcribe(y)))
        print(f"\r{i + 1}/{len(picked)} utterances", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    atomic.write_text(args.out, json.dumps(rows, indent=0))
    n = sum(r["n"] for r in rows)
    s, d, ins = (sum(r[k] for r in rows) for k in ("s", "d", "i"))
    print(f"{args.out}: {len(rows)} utterances, WER {100 * (s + d + ins) / n:.1f} % (substitutions "
          f"{100 * s / n:.1f}, deletions {100 * d / n:.1f}, insertions {100 * ins / n:.1f}) "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


def from_eval(args) -> int:
    """Per-utterance rows of one system of an ``rtanon eval`` output, from its cached transcripts (the
    transcript of ``OUT/systems/SYSTEM/dev/**/UTT.wav``, or of the data's own file for ``original``)."""
    from rtanon.io.kaldi import KaldiDir

    data = KaldiDir.load(args.data)
    cached = json.loads((Path(args.eval_dir) / "cache" / "transcripts.json").read_text())
    if args.system == "original":
        wanted = {str(Path(data.wav[u]).resolve()): u for u in data.wav}
    else:
        root = (Path(args.eval_dir) / "systems" / args.system / "dev").resolve()
        wanted = {str(p): p.stem for p in root.rglob("*.wav")}
    from rtanon.eval._worker import analyzer_names

    tag = analyzer_names(args.beam_size, (args.asr,))[f"text:{args.asr}"]
    hyps = {}
    for key, text in cached.items():
        analyzer, path = key.split("|")[:2]
        if analyzer == tag and path in wanted:
            hyps[wanted[path]] = text
    rows = []
    for utt in sorted(u for u in data.wav if u in data.text):
        if utt not in hyps:
            raise SystemExit(f"{args.eval_dir}: no cached transcript of {utt} for system {args.system}")
        rows.append(_row(utt, None, data.text[utt], hyps[utt]))
    atomic.write_text(args.out, json.dumps(rows, indent=0))
    n = sum(r["n"] for r in rows)
    print(f"{args.out}: {len(rows)} utterances, WER {100 * sum(errors(rows)) / n:.1f} %")
    return 0


def errors(rows: list[dict]) -> np.ndarray:
    return np.array([r["s"] + r["d"] + r["i"] for r in rows])


def runaways(rows: list[dict]) -> np.ndarray:
    """Per utterance: did the ASR loop (``rtanon.eval.metrics.asr_runaway``, as ``rtanon eval`` counts it)."""
    from rtanon.eval.metrics import asr_runaway

    return np.array([asr_runaway(r["ref"].split(), r["hyp"].split()) for r in rows])


def paired_difference(e0: np.ndarray, e1: np.ndarray, n: np.ndarray, resamples: int) -> tuple[float, float, float]:
    """WER difference (points) of errors ``e1`` against ``e0`` over utterances of ``n`` words, and its 95 %
    paired-bootstrap interval (resampling utterances, seed 0)."""
    idx = np.random.default_rng(0).integers(0, len(n), (resamples, len(n)))
    diff = 100 * (e1[idx].sum(1) - e0[idx].sum(1)) / n[idx].sum(1)
    lo, hi = np.percentile(diff, [2.5, 97.5])
    return 100 * (e1.sum() - e0.sum()) / n.sum(), lo, hi


def compare(args) -> int:
    """Each candidate against the baseline, then the same without the utterances on which the ASR looped
    for either system (the rule ``rtanon eval`` reports by): one loop adds about a hundred errors."""
    base = json.loads(Path(args.base).read_text())
    n, e0, loop0 = np.array([r["n"] for r in base]), errors(base), runaways(base)
    for path in args.others:
        other = json.loads(Path(path).read_text())
        if [(r["utt"], r.get("seed")) for r in other] != [(r["utt"], r.get("seed")) for r in base]:
            raise SystemExit(f"{path}: not the same utterances and voice seeds as {args.base}")
        e1 = errors(other)
        d, lo, hi = paired_difference(e0, e1, n, args.resamples)
        print(f"{path}: WER {100 * e1.sum() / n.sum():.1f} % against {100 * e0.sum() / n.sum():.1f} %: "
              f"{d:+.1f} points, 95 % interval [{lo:+.1f}, {hi:+.1f}]")
        keep = ~(loop0 | runaways(other))
        if not keep.all():
            d, lo, hi = paired_difference(e0[keep], e1[keep], n[keep], args.resamples)
            print(f"  without the {int((~keep).sum())} utterance(s) on which the ASR looped: WER "
                  f"{100 * e1[keep].sum() / n[keep].sum():.1f} % against {100 * e0[keep].sum() / n[keep].sum():.1f} "
                  f"%: {d:+.1f} points, 95 % interval [{lo:+.1f}, {hi:+.1f}]")
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="anonymize and transcribe every utterance, one fresh voice each")
    r.add_argument("data", help="Kaldi-style directory with a text file (e.g. ../shared/data/so762_dev)")
    r.add_argument("out", help="per-utterance results (JSON)")
    r.add_argument("--vocoder", help="vocoder.onnx to use instead of the packaged one")
    r.add_argument("--content", help="content_encoder.onnx to use instead of the packaged one")
    r.add_argument("--original", action="store_true", help="transcribe the original audio instead")
    r.add_argument("--stride", type=int, default=1, help="every N-th utterance only (default: all)")
    r.add_argument("--seed-base", type=int, default=1000, help="voice seed of utterance i: this + i (default 1000)")
    r.set_defaults(func=run)
    c = sub.add_parser("compare", help="paired bootstrap of WER against a baseline run")
    c.add_argument("base", help="baseline JSON from `run`")
    c.add_argument("others", nargs="+", help="candidate JSONs from `run` (same utterances and seeds)")
    c.add_argument("--resamples", type=int, default=5000)
    c.set_defaults(func=compare)
    e = sub.add_parser("from-eval", help="per-utterance rows of one system from an `rtanon eval` output's cache")
    e.add_argument("eval_dir", help="the --out directory of `rtanon eval`")
    e.add_argument("system", help="original, mcadams, neural, ...")
    e.add_argument("data", help="the Kaldi-style directory it evaluated (for the reference texts)")
    e.add_argument("out", help="per-utterance results (JSON)")
    e.add_argument("--asr", default="tiny.en", choices=("tiny.en", "base"),
                   help="whose cached transcripts (default tiny.en)")
    e.add_argument("--beam-size", type=int, default=2, help="the evaluation's --asr-beam-size (default 2)")
    e.set_defaults(func=from_eval)
    args = ap.parse_args(argv)
    return args.func(args)

