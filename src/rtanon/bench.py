"""Benchmarks of the streaming core: algorithmic latency and per-chunk compute (``rtanon bench``).

``bench_compute`` runs a session over real speech and reports, per stage and
in total, the per-chunk compute time (p50, p99 in ms) and the real-time factor
(compute seconds per audio second); the algorithmic latency is the sum of
the stages' ``latency_samples`` plus one chunk of buffering.

``bench_stage`` times one registered stage alone (``--stage NAME``); ``bench_streams`` how many sessions
one vocoder backend sustains when their steps are batched (``--streams``).

The live loop's own benchmarks (``--live-seconds``, ``--e2e``) are in ``rtanon.live.bench``.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ, AnonymizerConfig
from rtanon.engine import Anonymizer

WARMUP_CHUNKS = 10


def _stats(ns: list[int], audio_s: float) -> dict:
    ms = np.asarray(ns, np.float64) / 1e6
    return {"compute_p50_ms": float(np.percentile(ms, 50)), "compute_p99_ms": float(np.percentile(ms, 99)),
            "compute_max_ms": float(ms.max()), "rtf": float(ms.sum() / 1000.0 / audio_s)}


def speech_signal(seconds: float, path: str | None = None) -> np.ndarray:
    """``seconds`` of speech at 16 kHz: ``path`` or the embedded sample, looped."""
    from rtanon.io.audio import read_audio
    from rtanon.io.resources import demo_speech_path

    if path is None:
        with demo_speech_path() as p:
            x = read_audio(p)
    else:
        x = read_audio(path)
    reps = int(np.ceil(seconds * SAMPLE_RATE_HZ / x.shape[0]))
    return np.tile(x, reps)[: int(seconds * SAMPLE_RATE_HZ)]


def bench_compute(anonymizer: Anonymizer, signal: np.ndarray) -> dict:
    """Per-stage and total compute figures of one session over ``signal``."""
    session = anonymizer.open_session(seed=0, profile=True)
    n = session.chunk_samples
    chunks = signal[: signal.shape[0] // n * n].reshape(-1, n)
    for c in chunks[:WARMUP_CHUNKS]:
        session.process(c)
    session.times.by_stage.clear()
    session.times.total.clear()
    parts = [s for s in session.stages if hasattr(s, "part_times")]
    for s in parts:
        s.part_times = {}
    for c in chunks[WARMUP_CHUNKS:]:
        session.process(c)
    if session.counters.stage_errors:  # the session played comfort noise: these timings would mean nothing
        raise RuntimeError(f"{session.counters.stage_errors} chunks failed in the benchmark session "
                           f"(last: {session.counters.last_error})")
    audio_s = (chunks.shape[0] - WARMUP_CHUNKS) * n / SAMPLE_RATE_HZ
    stage_lat = {"vad": session.vad.latency_samples}
    stage_lat.update({type(s).__name__: s.latency_samples for s in session.stages})
    stages = {name: {"latency_ms": 1000.0 * stage_lat.get(name, 0) / SAMPLE_RATE_HZ, **_stats(ns, audio_s)}
              for name, ns in session.times.by_stage.items()}
    for s in parts:  # sub-parts of a composite stage (the neural voice), under its "parts" key
        stages[type(s).__name__]["parts"] = {name: _stats(ns, audio_s) for name, ns in s.part_times.items()}
    extra = {}
    if anonymizer.config.method == "neural":
        backend = anonymizer.method.model.backend
        extra = {"backend": anonymizer.config.neural.backend,
                 "device": getattr(backend, "device", anonymizer.config.neural.device),
                 "cuda_graphs": bool(getattr(backend, "uses_cuda_graphs", False))}
    guard = stages.pop("guard", None)  # the engine's pass-through check, not a stage: its own figure
    if guard is not None:
        budget_ms = 1000.0 * n / SAMPLE_RATE_HZ
        extra["guard"] = {**guard, "p99_pct_of_chunk": 100.0 * guard["compute_p99_ms"] / budget_ms,
                          "p50_pct_of_chunk": 100.0 * guard["compute_p50_ms"] / budget_ms}
    return {"method": anonymizer.config.method, **extra, "chunk_ms": anonymizer.config.stream.chunk_ms,
            "audio_s": audio_s, "buffering_ms": 1000.0 * n / SAMPLE_RATE_HZ,
            "algorithmic_latency_ms": 1000.0 * session.algorithmic_latency_samples / SAMPLE_RATE_HZ,
            **_stats(session.times.total, audio_s), "stages": stages}



def _vad_stage(config: AnonymizerConfig):
    from rtanon.stages.vad import VadStage

    return VadStage(config.vad, config.stream.chunk_samples)


def _mcadams_stage(config: AnonymizerConfig):
    from rtanon.stages.mcadams import McAdamsStage

    return McAdamsStage(config.mcadams, config.stream.chunk_samples, alpha=0.8)


def _f0_stage(config: AnonymizerConfig):
    from rtanon.f0.tracker import F0Tracker

    return F0Tracker(hop=config.stream.chunk_samples)


def _content_stage(config: AnonymizerConfig):
    from importlib import resources

    from rtanon.content.stream import ContentEncoderModel
    from rtanon.stages.neural import content_ref

    with resources.as_file(content_ref(config.neural)) as path:  # the privacy point's, or --content
        return ContentEncoderModel(path).open_stream(config.stream.chunk_samples)


#: Stages that ``rtanon bench --stage NAME`` can time alone: name -> factory(config).
BENCH_STAGES: dict[str, Callable[[AnonymizerConfig], object]] = {
    "vad": _vad_stage,
    "mcadams": _mcadams_stage,
    "f0": _f0_stage,
    "content": _content_stage,
}


def bench_stage(name: str, config: AnonymizerConfig, signal: np.ndarray) -> dict:
    """Times the stage ``name`` alone, chunk by chunk, over ``signal``."""
    stage = BENCH_STAGES[name](config)
    n = stage.hop
    chunks = signal[: signal.shape[0] // n * n].reshape(-1, n).astype(np.float32)
    times = []
    for i, c in enumerate(chunks):
        t0 = time.perf_counter_ns()
        stage.process(c)
        if i >= WARMUP_CHUNKS:
            times.append(time.perf_counter_ns() - t0)
    audio_s = len(times) * n / SAMPLE_RATE_HZ
    lat = 1000.0 * stage.latency_samples / SAMPLE_RATE_HZ
    figures = {"latency_ms": lat, **_stats(times, audio_s)}
    return {"stage": name, "chunk_ms": 1000.0 * n / SAMPLE_RATE_HZ, "audio_s": audio_s,
            "algorithmic_latency_ms": lat, **figures, "stages": {name: figures}}


# -- end to end ------------------------------------------------------------------

#: the fake microphone's recording is the end-to-end reference only when it matches what was played this well

def bench_streams(anonymizer: Anonymizer, max_streams: int = 64, calls: int = 200,
                  clock: Callable[[], int] = time.perf_counter_ns) -> dict:
    """How many concurrent sessions one vocoder backend sustains when their 20 ms steps are batched.

    For batch sizes 1, 2, 4, ... up to ``max_streams``, times ``calls`` streaming steps of one 20 ms frame
    for the whole batch (random content, voiced F0, unit-norm speakers, explicit state carried) and
    reports p50/p99 per call. A batch is real-time when its p99 stays under the frame (20 ms). Once a
    doubling fails, the batch sizes between the last real-time one and it are bisected to within 1/16
    of the former, so ``max_realtime_streams`` is the largest real-time batch found, not only a power of
    two. Only the vocoder is batched: each session's content encoder and F0 tracker run on the CPU
    either way (see the per-stage figures of ``bench_compute``). ``clock``: nanoseconds (for tests)."""
    from rtanon.constants import FRAME_SAMPLES

    if anonymizer.config.method != "neural":
        raise ValueError("--streams measures the neural method's vocoder; use --method neural")
    backend = anonymizer.method.model.backend
    vcfg = anonymizer.method.model.vocoder_config
    k = vcfg.units_dim
    s_dim = vcfg.speaker_dim
    frame_ms = 1000.0 * FRAME_SAMPLES / SAMPLE_RATE_HZ
    rng = np.random.default_rng(0)

    def timed(b: int) -> dict:
        units = rng.standard_normal((b, 1, k), dtype=np.float32)
        f0 = np.full((b, 2), 140.0, np.float32)
        spk = rng.standard_normal((b, s_dim)).astype(np.float32)
        spk /= np.linalg.norm(spk, axis=1, keepdims=True)
        state = backend.init_state(b)
        ns = []
        for i in range(calls + WARMUP_CHUNKS):
            noise = rng.standard_normal((b, FRAME_SAMPLES), dtype=np.float32)
            t0 = clock()
            _, state = backend.step(units, f0, spk, noise, state)
            if i >= WARMUP_CHUNKS:
                ns.append(clock() - t0)
        ms = np.asarray(ns) / 1e6
        row = {"streams": b, "step_p50_ms": float(np.percentile(ms, 50)), "step_p99_ms": float(np.percentile(ms, 99)),
               "per_stream_p50_ms": float(np.percentile(ms, 50)) / b}
        row["realtime"] = row["step_p99_ms"] < frame_ms
        return row

    rows, best, failed = [], 0, None
    b = 1
    while b <= max_streams:
        rows.append(timed(b))
        if not rows[-1]["realtime"]:
            failed = b
            break
        best = b
        b *= 2
    if best and failed:  # bisect (best, failed)
        lo, hi = best, failed
        while hi - lo > max(1, lo // 16):
            mid = (lo + hi) // 2
            rows.append(timed(mid))
            lo, hi = (mid, hi) if rows[-1]["realtime"] else (lo, mid)
        best = lo
    rows.sort(key=lambda r: r["streams"])
    return {"backend": anonymizer.config.neural.backend, "device": getattr(backend, "device", "?"),
            "cuda_graphs": bool(getattr(backend, "uses_cuda_graphs", False)),
            "frame_ms": frame_ms, "max_realtime_streams": best, "batches": rows}
