"""Benchmark the streaming vocoder step with ONNX Runtime on the CPU.

    PYTHONPATH=src python -m rtanon.neural.bench_vocoder [--frames 1] [--iters 400] [--threads 1]
        [--config '{"initial_channels": 192}'] [--json]

Exports an untrained generator (random weights: compute does not depend on
the weights) to a temporary ONNX file and times ``iters`` streaming calls of
``frames`` 50 Hz frames (1 frame = 20 ms of audio), after a warm-up. Prints
the parameter count, the fp32 weight size, the ONNX file size, p50/p90/p99
compute per call and the real-time factor, and, as a machine-load
reference measured in the same run, the time of a fixed 256x256 float32
matrix product repeated 100 times (so runs on a loaded machine can be
compared by ratio). Timings are noisy when other processes share the CPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _reference_ms(reps: int = 50) -> float:
    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(100):
            a @ a
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def run(config_json: str = "{}", frames: int = 1, iters: int = 400, threads: int = 1) -> dict:
    import torch

    from rtanon.neural.backends import make_backend
    from rtanon.neural.vocoder import HOP_SAMPLES, CausalNsfHifiGan, VocoderConfig, export_onnx

    torch.manual_seed(0)
    cfg_kwargs = json.loads(config_json)
    for k in ("upsample_rates", "resblock_kernel_sizes"):
        if k in cfg_kwargs:
            cfg_kwargs[k] = tuple(cfg_kwargs[k])
    if "resblock_dilations" in cfg_kwargs:
        cfg_kwargs["resblock_dilations"] = tuple(tuple(d) for d in cfg_kwargs["resblock_dilations"])
    cfg = VocoderConfig(**cfg_kwargs)
    model = CausalNsfHifiGan(cfg)
    n_params = model.folded().num_parameters()
    with tempfile.TemporaryDirectory() as tmp:
        path = export_onnx(model, Path(tmp) / "vocoder.onnx")
        onnx_mb = path.stat().st_size / 2**20
        backend = make_backend("onnxruntime", onnx_path=path, threads=threads)
        rng = np.random.default_rng(0)
        units = rng.dirichlet(np.ones(cfg.units_dim) * 0.1, size=(1, frames)).astype(np.float32)
        f0 = np.full((1, 2 * frames), 140.0, np.float32)
        spk = rng.standard_normal((1, cfg.speaker_dim)).astype(np.float32)
        state = backend.init_state(1)
        times = []
        for i in range(iters + 30):
            noise = rng.standard_normal((1, HOP_SAMPLES * frames)).astype(np.float32)
            t = time.perf_counter()
            _, state = backend.step(units, f0, spk, noise, state)
            if i >= 30:
                times.append(time.perf_counter() - t)
    ms = np.array(times) * 1000
    chunk_ms = 20.0 * frames
    return {
        "config": cfg_kwargs, "frames_per_call": frames, "chunk_ms": chunk_ms, "threads": threads,
        "parameters": n_params, "weights_fp32_mb": n_params * 4 / 2**20, "onnx_mb": onnx_mb,
        "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)), "rtf_p50": float(np.percentile(ms, 50) / chunk_ms),
        "reference_matmul_ms": _reference_ms(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="{}", help="VocoderConfig fields as JSON")
    ap.add_argument("--frames", type=int, default=1, help="50 Hz frames per call (1 = 20 ms chunk)")
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    r = run(a.config, a.frames, a.iters, a.threads)
    if a.json:
        print(json.dumps(r))
        return
    print(f"config {r['config'] or 'default'}; {r['frames_per_call']} frame(s) = {r['chunk_ms']:.0f} ms per call, "
          f"{r['threads']} thread(s)")
    print(f"parameters {r['parameters']:,}  weights fp32 {r['weights_fp32_mb']:.2f} MiB  onnx {r['onnx_mb']:.2f} MiB")
    print(f"ORT compute per call: p50 {r['p50_ms']:.2f} ms  p90 {r['p90_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
          f"(RTF p50 {r['rtf_p50']:.3f})")
    print(f"load reference: 100x 256x256 matmul {r['reference_matmul_ms']:.2f} ms (median)")


if __name__ == "__main__":
    main()
