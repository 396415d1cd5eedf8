"""Benchmark the streaming vocoder step with ONNX Runtime on the CPU.

    rtanon lab bench-vocoder [--frames 1] [--iters 400] [--threads 1]
        [--config '{"initial_channels": 192}' ...] [--json]

Exports untrained generators (random weights: compute does not depend on the
weights) to temporary ONNX files and times ``iters`` streaming calls of
``frames`` 50 Hz frames each (1 frame = 20 ms of audio) after a warm-up.
Several ``--config`` are timed interleaved, call by call, so they see the same
machine load. Prints per config the parameter count, fp32 weight size, ONNX
file size, min/p50/p90/p99 compute per call and the real-time factor, and
the time of a fixed 256x256 float32 matrix product repeated 100 times as a
machine-load reference from the same run. On a shared machine the minimum
is the best estimate of the compute itself; p50/p99 include waiting for the
CPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _reference_ms(reps: int = 30) -> float:
    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(100):
            a @ a
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def _config(config_json: str):
    from rtanon.neural.vocoder import VocoderConfig

    kw = json.loads(config_json)
    for k in ("upsample_rates", "resblock_kernel_sizes"):
        if k in kw:
            kw[k] = tuple(kw[k])
    if "resblock_dilations" in kw:
        kw["resblock_dilations"] = tuple(tuple(d) for d in kw["resblock_dilations"])
    return kw, VocoderConfig(**kw)


def run(configs: list[str] = ("{}",), frames: int = 1, iters: int = 400, threads: int = 1,
        reference_reps: int = 30) -> list[dict]:
    import torch

    from rtanon.neural.backends import make_backend
    from rtanon.constants import FRAME_SAMPLES
    from rtanon.neural.vocoder import HarmonicNoiseVocoder
    from rtanon.train.export import export_vocoder_onnx

    rng = np.random.default_rng(0)
    items = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, cj in enumerate(configs):
            kw, cfg = _config(cj)
            torch.manual_seed(0)
            model = HarmonicNoiseVocoder(cfg)
            path = export_vocoder_onnx(model, Path(tmp) / f"vocoder{i}.onnx")
            backend = make_backend("onnxruntime", onnx_path=path, threads=threads)
            units = rng.standard_normal((1, frames, cfg.units_dim), dtype=np.float32)
            spk = rng.standard_normal((1, cfg.speaker_dim)).astype(np.float32)
            items.append({"config": kw, "parameters": model.folded().num_parameters(),
                          "onnx_mb": path.stat().st_size / 2**20, "backend": backend, "units": units, "spk": spk,
                          "state": backend.init_state(1), "times": []})
        f0 = np.full((1, 2 * frames), 140.0, np.float32)
        warmup = min(30, iters)
        for it in range(iters + warmup):
            for item in items:
                noise = rng.standard_normal((1, FRAME_SAMPLES * frames), dtype=np.float32)
                t = time.perf_counter()
                _, item["state"] = item["backend"].step(item["units"], f0, item["spk"], noise, item["state"])
                if it >= warmup:
                    item["times"].append(time.perf_counter() - t)
    ref = _reference_ms(reference_reps)
    chunk_ms = 20.0 * frames
    out = []
    for item in items:
        ms = np.array(item["times"]) * 1000
        out.append({"config": item["config"], "frames_per_call": frames, "chunk_ms": chunk_ms, "threads": threads,
                    "parameters": item["parameters"], "weights_fp32_mb": item["parameters"] * 4 / 2**20,
                    "onnx_mb": item["onnx_mb"], "min_ms": float(ms.min()),
                    "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
                    "p99_ms": float(np.percentile(ms, 99)), "rtf_p50": float(np.percentile(ms, 50) / chunk_ms),
                    "reference_matmul_ms": ref})
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", help="VocoderConfig fields as JSON (repeat to compare)")
    ap.add_argument("--frames", type=int, default=1, help="50 Hz frames per call (1 = 20 ms chunk)")
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    ap.add_argument("--reference-reps", type=int, default=30, help="repeats of the load reference")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    results = run(a.config or ["{}"], a.frames, a.iters, a.threads, a.reference_reps)
    if a.json:
        print(json.dumps(results))
        return
    r0 = results[0]
    print(f"ONNX Runtime CPU, {r0['threads']} thread(s), {r0['frames_per_call']} frame(s) = {r0['chunk_ms']:.0f} ms "
          f"per call, {a.iters} calls per config (interleaved)")
    print(f"{'config':48s} {'params':>10s} {'MiB':>5s} {'min':>6s} {'p50':>6s} {'p90':>6s} {'p99':>6s} {'RTF50':>6s}")
    for r in results:
        name = json.dumps(r["config"]) if r["config"] else "default"
        print(f"{name[:48]:48s} {r['parameters']:>10,d} {r['weights_fp32_mb']:5.2f} {r['min_ms']:6.2f} "
              f"{r['p50_ms']:6.2f} {r['p90_ms']:6.2f} {r['p99_ms']:6.2f} {r['rtf_p50']:6.3f}")
    print(f"load reference: 100x 256x256 matmul {r0['reference_matmul_ms']:.1f} ms (median)")

