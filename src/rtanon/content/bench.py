"""Per-chunk compute time of the ONNX streaming content encoder.

    python -m rtanon.content.bench [--chunk-ms 20] [--onnx PATH] [--seconds 30]

Streams the embedded demo utterance (looped to ``--seconds``) through
``ContentEncoderStage`` chunk by chunk on one thread and prints p50/p99 of
the per-chunk compute time; the last line is JSON with ``compute_p50_ms`` and
``compute_p99_ms`` (what ``rtanon bench --stage content --json`` reports).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def measure_content_chunks(chunk_ms: int = 20, seconds: float = 30.0, onnx_path: str | Path | None = None,
                           warmup_chunks: int = 50, threads: int = 1) -> dict:
    """Streams speech through the ONNX content encoder; returns compute times per chunk in ms.

    Keys: ``compute_p50_ms``, ``compute_p99_ms``, ``compute_mean_ms``, ``compute_max_ms``,
    ``chunk_ms``, ``chunks`` (number timed), ``real_time_factor`` (mean compute / chunk duration).
    """
    from rtanon.audio_io import read_audio
    from rtanon.content.stream import ContentEncoderModel, ContentStreamConfig
    from rtanon.resources import demo_speech_path

    with demo_speech_path() as p:
        speech = read_audio(p)
    hop = 16 * chunk_ms
    n_chunks = int(seconds * 1000 / chunk_ms) + warmup_chunks
    reps = -(-n_chunks * hop // len(speech))
    audio = np.tile(speech, reps)[:n_chunks * hop].astype(np.float32)
    stage = ContentEncoderModel(onnx_path, ContentStreamConfig(threads=threads)).open_stream(hop)
    times = []
    for i in range(n_chunks):
        chunk = audio[i * hop:(i + 1) * hop]
        t0 = time.perf_counter_ns()
        stage.process(chunk)
        dt = time.perf_counter_ns() - t0
        if i >= warmup_chunks:
            times.append(dt / 1e6)
    t = np.asarray(times)
    return {"stage": "content", "chunk_ms": chunk_ms, "chunks": int(len(t)),
            "compute_p50_ms": round(float(np.percentile(t, 50)), 4),
            "compute_p99_ms": round(float(np.percentile(t, 99)), 4),
            "compute_mean_ms": round(float(t.mean()), 4), "compute_max_ms": round(float(t.max()), 4),
            "real_time_factor": round(float(t.mean() / chunk_ms), 5)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtanon.content.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk-ms", type=int, default=20, choices=(10, 20, 30, 40))
    ap.add_argument("--seconds", type=float, default=30.0, help="audio streamed (default 30 s)")
    ap.add_argument("--onnx", default=None, help="ONNX file (default: the packaged model)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    r = measure_content_chunks(args.chunk_ms, args.seconds, args.onnx, threads=args.threads)
    print(f"content encoder (ONNX Runtime, {args.threads} thread): {r['chunks']} chunks of {r['chunk_ms']} ms: "
          f"p50 {r['compute_p50_ms']:.3f} ms, p99 {r['compute_p99_ms']:.3f} ms, "
          f"mean {r['compute_mean_ms']:.3f} ms, max {r['compute_max_ms']:.3f} ms, RTF {r['real_time_factor']:.4f}")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
