"""``rtanon anonymize-dir --bench``: throughput of corpus anonymization, in this process and on Ray.

The same utterances, with the same voices (a fixed seed), are anonymized

1. in this process (:class:`rtanon.corpus.InProcessExecutor`), the baseline;
2. on Ray with 1, 2, ... ``workers`` actors (a local Ray, or the cluster at
   ``address``), each into its own temporary output folder.

For each run it prints the wall time of the anonymization (models loaded
before the clock starts; their load time is shown apart), the speed in times
real time (audio seconds / wall seconds), the real-time factor (wall / audio)
in total and per worker (the worker's busy wall time / the audio it did), the
1-minute load average of the machine before and after, and whether the
outputs are byte-identical to the baseline's. Ray's overhead is the 1-worker
Ray run's wall time against the in-process run's, measured in the same call.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rtanon.corpus import MANIFEST_FILE, CorpusPlan, InProcessExecutor, run_corpus
from rtanon.kaldi import KaldiDir


def _subset(data: KaldiDir, limit: int | None) -> KaldiDir:
    utts = sorted(data.wav)[:limit] if limit else sorted(data.wav)
    return replace(data, wav={u: data.wav[u] for u in utts}, utt2spk={u: data.utt2spk[u] for u in utts},
                   text={u: data.text[u] for u in utts if u in data.text})


def _outputs(out: Path) -> dict[str, str]:
    recs = json.loads((out / MANIFEST_FILE).read_text())["utterances"]
    return {u: r["output_sha256"] for u, r in recs.items()}


def _load() -> float:
    return os.getloadavg()[0]


def _measure(name: str, data: KaldiDir, out: Path, config, factory, batch: int, seed: int) -> dict:
    plan = CorpusPlan(data, out, config, seed=seed, batch=batch, progress=False)
    executors = []

    def make():
        executors.append(factory())
        return executors[-1]

    load0 = _load()
    result = run_corpus(plan, make)
    ex = executors[0]
    row = {"run": name, "workers": ex.workers, "utterances": result.done, "failed": len(result.failed),
           "audio_s": round(result.audio_s, 2), "wall_s": round(result.process_s, 3),
           "startup_s": round(ex.startup_s, 2),
           "x_real_time": round(result.audio_s / result.process_s, 2),
           "rtf_total": round(result.process_s / result.audio_s, 4),
           "rtf_per_worker": {w: round(v["wall_s"] / max(v["audio_s"], 1e-9), 4)
                              for w, v in sorted(result.workers.items(), key=lambda kv: str(kv[0]))},
           "load_before": round(load0, 2), "load_after": round(_load(), 2)}
    print(f"{name:>14}  {row['workers']:>2} workers  {row['wall_s']:8.2f} s  {row['x_real_time']:7.2f}x real time  "
          f"RTF {row['rtf_total']:.4f} (per worker {', '.join(f'{v:.4f}' for v in row['rtf_per_worker'].values())})"
          f"  startup {row['startup_s']:.1f} s  load {row['load_before']:.2f} -> {row['load_after']:.2f}", flush=True)
    return row


def bench(data: KaldiDir, config, workers: int, address: str | None = None, limit: int | None = None,
          batch: int = 4, seed: int | None = None) -> dict:
    """Runs the measurements of the module docstring and prints them (the last line is JSON)."""
    from rtanon.corpus_ray import RayExecutor, start_ray, stop_ray

    seed = 0 if seed is None else seed
    data = _subset(data, limit)
    from rtanon.audio_io import probe

    audio_s = sum(probe(p).seconds for p in data.wav.values())
    print(f"bench: {data.root} ({len(data.wav)} utterances, {audio_s / 3600:.3f} h), method {config.method}, "
          f"chunk {config.stream.chunk_ms} ms, {os.cpu_count()} cores here, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"Ray {'cluster ' + address if address else 'local'}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rtanon-bench-") as tmp:
        tmp = Path(tmp)
        rows.append(_measure("in-process", data, tmp / "inproc", config,
                             lambda: InProcessExecutor(config), batch, seed))
        t0 = time.perf_counter()
        resources = start_ray(address, workers)
        ray_init_s = time.perf_counter() - t0
        print(f"ray: {'connected to ' + address if address else 'started locally'} in {ray_init_s:.1f} s; "
              f"cluster resources: CPU {resources.get('CPU', 0):g}, GPU {resources.get('GPU', 0):g}, "
              f"nodes {sum(1 for k in resources if k.startswith('node:') and k != 'node:__internal_head__')}",
              flush=True)
        try:
            for k in range(1, workers + 1):
                rows.append(_measure("ray", data, tmp / f"ray{k}", config,
                                     lambda k=k: RayExecutor(config, None, k), batch, seed))
                rows[-1]["identical_to_in_process"] = _outputs(tmp / f"ray{k}") == _outputs(tmp / "inproc")
        finally:
            stop_ray()
        rows.append(_measure("in-process", data, tmp / "inproc2", config,
                             lambda: InProcessExecutor(config), batch, seed))
    base = min(r["wall_s"] for r in rows if r["run"] == "in-process")
    one = next(r for r in rows if r["run"] == "ray" and r["workers"] == 1)
    overhead = one["wall_s"] / base - 1.0
    identical = all(r.get("identical_to_in_process", True) for r in rows)
    print(f"Ray overhead, 1 worker against this process (the faster of its two runs): {100 * overhead:+.1f} %; "
          f"Ray outputs byte-identical to the in-process ones: {'yes' if identical else 'NO'}")
    summary = {"data": str(data.root), "utterances": len(data.wav), "audio_s": round(audio_s, 2),
               "method": config.method, "ray": address or "local", "ray_init_s": round(ray_init_s, 2),
               "ray_overhead": round(overhead, 4), "identical": identical, "runs": rows}
    print(json.dumps(summary))
    return summary
