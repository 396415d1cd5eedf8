"""``rtanon anonymize-dir --bench``: throughput of corpus anonymization, in this process and on Ray.

The same utterances, with the same voices (a fixed seed), are anonymized

1. in this process (:class:`rtanon.corpus.run.InProcessExecutor`), the baseline,
   alternating with Ray with 1 actor (``repeat`` times each, Ray started for
   both, so load changes hit both alike);
2. on Ray with 2, ... ``workers`` actors (a local Ray, or the cluster at
   ``address``),

each into its own temporary output folder.

For each run it prints the wall time of the anonymization (models loaded
before the clock starts; their load time is shown apart), the speed in times
real time (audio seconds / wall seconds), the real-time factor (wall / audio)
in total and per worker (the worker's busy wall time / the audio it did), the
worker's CPU seconds per audio second (what the work costs whatever else runs
on the machine; Ray's own processes are not in it), the CPU seconds of the
whole run (this process, and for a local Ray every process it started), the
1-minute load average of the machine before and after, and whether every
run's outputs are byte-identical. Ray's overhead is the median 1-worker Ray
wall time against the median in-process one, measured in the same call.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rtanon.corpus.run import MANIFEST_FILE, CorpusPlan, InProcessExecutor, run_corpus
from rtanon.io.kaldi import KaldiDir


def _subset(data: KaldiDir, limit: int | None) -> KaldiDir:
    utts = sorted(data.wav)[:limit] if limit else sorted(data.wav)
    return replace(data, wav={u: data.wav[u] for u in utts}, utt2spk={u: data.utt2spk[u] for u in utts},
                   text={u: data.text[u] for u in utts if u in data.text})


def _outputs(out: Path) -> dict[str, str]:
    recs = json.loads((out / MANIFEST_FILE).read_text())["utterances"]
    return {u: r["output_sha256"] for u, r in recs.items()}


def _proc_cpu_ticks() -> dict[int, tuple[int, int, int]] | None:
    """{pid: (ppid, own CPU ticks, ticks of the children it reaped)} of every process, from /proc; None where
    there is no /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    stats = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()  # state, ppid, ..., utime stime cutime cstime at 11..14
        stats[int(d.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))
    return stats


class CpuMeter:
    """CPU seconds used between :meth:`start` and :meth:`stop` by this process (with the children it reaped)
    or, with ``tree``, by it and every process below it, each its own time: a local Ray's daemons and
    actors. Those come and go
    during a run (the actors are killed before it returns, and nothing in the tree reaps them), so a
    thread samples each one's own CPU time every ``every_s`` and a process counts what it used from its
    first to its last sample: one that exits loses at most its last ``every_s``, never a negative."""

    def __init__(self, tree: bool, every_s: float = 0.1) -> None:
        import threading

        self.tree, self.every_s = tree, every_s
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtanon-cpu-meter", daemon=True)

    def _sample(self, first: bool = False) -> bool:
        stats = _proc_cpu_ticks()
        if stats is None:
            return False
        me = os.getpid()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        stack = [me]
        while stack:
            pid = stack.pop()
            if pid not in stats:
                continue
            ticks = stats[pid][1] + (stats[pid][2] if pid == me and not self.tree else 0)
            self._last[pid] = ticks
            self._first.setdefault(pid, ticks if first else 0)  # a process born in the run counts from 0
            if self.tree:
                stack.extend(children.get(pid, []))
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def start(self) -> "CpuMeter":
        if self._sample(first=True) and self.tree:
            self._thread.start()
        return self

    def stop(self) -> float | None:
        """-> the CPU seconds; None where there is no /proc."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        if not self._sample():
            return None
        return sum(self._last[p] - self._first[p] for p in self._last) / os.sysconf("SC_CLK_TCK")


def _load() -> float:
    return os.getloadavg()[0]


def _measure(name: str, data: KaldiDir, out: Path, config, factory, batch: int, seed: int,
             count_cpu: bool = True) -> dict:
    plan = CorpusPlan(data, out, config, seed=seed, batch=batch, progress=False)
    ex = factory()  # models loaded (and warmed up) before the clocks start
    tree = name != "in-process"
    load0, meter = _load(), CpuMeter(tree).start() if count_cpu else None
    result = run_corpus(plan, lambda: ex)
    cpu_s = meter.stop() if meter else None
    row = {"run": name, "workers": ex.workers, "utterances": result.done, "failed": len(result.failed),
           "audio_s": round(result.audio_s, 2), "wall_s": round(result.process_s, 3),
           "startup_s": round(ex.startup_s, 2),
           "x_real_time": round(result.audio_s / result.process_s, 2),
           "rtf_total": round(result.process_s / result.audio_s, 4),
           "rtf_per_worker": {w: round(v["wall_s"] / max(v["audio_s"], 1e-9), 4)
                              for w, v in sorted(result.workers.items(), key=lambda kv: str(kv[0]))},
           "cpu_rtf_per_worker": {w: round(v["cpu_s"] / max(v["audio_s"], 1e-9), 4)
                                  for w, v in sorted(result.workers.items(), key=lambda kv: str(kv[0]))},
           "cpu_s": None if cpu_s is None else round(cpu_s, 2),
           "load_before": round(load0, 2), "load_after": round(_load(), 2)}
    row["worker_names"] = [str(w) for w in sorted(result.workers, key=str)]
    print(f"{name:>14}  {row['workers']:>2} workers  {row['wall_s']:8.2f} s  {row['x_real_time']:7.2f}x real time  "
          f"RTF {row['rtf_total']:.4f} (per worker {', '.join(f'{v:.4f}' for v in row['rtf_per_worker'].values())}; "
          f"CPU s / audio s {', '.join(f'{v:.4f}' for v in row['cpu_rtf_per_worker'].values())})  "
          f"CPU {'n/a' if row['cpu_s'] is None else row['cpu_s']} s  startup {row['startup_s']:.1f} s  load {row['load_before']:.2f} -> {row['load_after']:.2f}", flush=True)
    return row


def bench(data: KaldiDir, config, workers: int, address: str | None = None, limit: int | None = None,
          batch: int = 4, seed: int | None = None, repeat: int = 2) -> dict:
    """Runs the measurements of the module docstring and prints them (the last line is JSON). In-process and
    1-worker Ray runs alternate ``repeat`` times, so a change in the machine's load hits both alike."""
    from statistics import median

    from rtanon.io.audio import probe
    from rtanon.corpus.on_ray import RayExecutor, start_ray, stop_ray

    seed = 0 if seed is None else seed
    data = _subset(data, limit)
    audio_s = sum(probe(p).seconds for p in data.wav.values())
    print(f"bench: {data.root} ({len(data.wav)} utterances, {audio_s / 3600:.3f} h), method {config.method}, "
          f"chunk {config.stream.chunk_ms} ms, batch {batch}, {os.cpu_count()} cores here, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, Ray {'cluster ' + address if address else 'local'}",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rtanon-bench-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        resources = start_ray(address, workers)
        ray_init_s = time.perf_counter() - t0
        import ray

        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        print(f"ray: {'connected to ' + address if address else 'started locally'} in {ray_init_s:.1f} s; "
              f"cluster: CPU {resources.get('CPU', 0):g}, GPU {resources.get('GPU', 0):g}, {nodes} nodes", flush=True)
        n = 0

        def measure(name, factory):
            nonlocal n
            n += 1
            out = tmp / f"run{n}"
            # the CPU seconds of a cluster's nodes are not this process's to count
            rows.append(_measure(name, data, out, config, factory, batch, seed, count_cpu=not address))
            rows[-1]["outputs"] = _outputs(out)

        try:
            for _ in range(repeat):
                measure("in-process", lambda: InProcessExecutor(config))
                measure("ray", lambda: RayExecutor(config, None, 1))
            for k in range(2, workers + 1):
                for _ in range(repeat):
                    measure("ray", lambda k=k: RayExecutor(config, None, k))
        finally:
            stop_ray()
    ref = rows[0].pop("outputs")
    identical = all(r.pop("outputs", ref) == ref for r in rows)
    base = median(r["wall_s"] for r in rows if r["run"] == "in-process")
    one = median(r["wall_s"] for r in rows if r["run"] == "ray" and r["workers"] == 1)
    overhead = one / base - 1.0
    fastest = min(r["wall_s"] for r in rows if r["run"] == "ray" and r["workers"] == 1) / min(
        r["wall_s"] for r in rows if r["run"] == "in-process") - 1.0
    print(f"Ray overhead, 1 worker against this process, wall time: {100 * overhead:+.1f} % (medians of {repeat} "
          f"alternating runs each), {100 * fastest:+.1f} % (fastest of each)")
    cpu_overhead = None
    if not address and all(r["cpu_s"] is not None for r in rows):
        cpu_overhead = median(r["cpu_s"] for r in rows if r["run"] == "ray" and r["workers"] == 1) / median(
            r["cpu_s"] for r in rows if r["run"] == "in-process") - 1.0
        print(f"Ray overhead in CPU seconds (this process and every Ray process it started, against this process "
              f"alone; little affected by the load): {100 * cpu_overhead:+.1f} %")
    print(f"outputs of every run byte-identical: {'yes' if identical else 'NO'}")
    for k in range(1, workers + 1):
        best = max((r for r in rows if r["run"] == "ray" and r["workers"] == k), key=lambda r: r["x_real_time"])
        print(f"ray, {k} workers: best {best['x_real_time']:.1f}x real time (RTF {best['rtf_total']:.4f}), "
              f"load {best['load_before']:.2f} -> {best['load_after']:.2f}")
    summary = {"data": str(data.root), "utterances": len(data.wav), "audio_s": round(audio_s, 2),
               "method": config.method, "chunk_ms": config.stream.chunk_ms, "batch": batch,
               "ray": address or "local", "ray_init_s": round(ray_init_s, 2), "nodes": nodes,
               "ray_overhead": round(overhead, 4), "ray_overhead_fastest": round(fastest, 4),
               "ray_overhead_cpu": None if cpu_overhead is None else round(cpu_overhead, 4), "identical": identical, "runs": rows}
    print(json.dumps(summary))
    return summary
