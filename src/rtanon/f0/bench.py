"""F0 tracker benchmark: accuracy against pYAAPT (and harvest, Praat), C++/Numba
parity, and speed against pYAAPT measured in the same run.

References, all optional and imported here only (never by the package at run time):
``amfm_decompy`` (pYAAPT, the reference), ``pyworld`` (harvest, from
``pyworld-prebuilt``), ``parselmouth`` (Praat, from ``praat-parselmouth``; GPL,
benchmark only). Each missing one is reported and skipped.

Alignment: our frame k is centred at k * 10 ms. pYAAPT's frame j is centred at
17.5 ms + j * 10 ms; the signal given to pYAAPT is prefixed with 7.5 ms of
zeros so its frame j lands on our frame j + 1. Harvest (frame_period 10 ms)
is centred at k * 10 ms; Praat is read at k * 10 ms. All trackers search
60-400 Hz.

Metrics against pYAAPT over all frames of the selected files: GPE = share of
frames voiced in both whose F0 differs by more than 20 %; VDE = share of all
frames whose voicing decision differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rtanon.constants import SAMPLE_RATE_HZ
from rtanon.f0.config import HOP_SAMPLES, F0Config

F0_MIN_HZ, F0_MAX_HZ = 60.0, 400.0


def yaapt_f0(x: np.ndarray) -> np.ndarray:
    """pYAAPT's F0 (its samp_values: 0 unvoiced) on our frame grid (k * 10 ms)."""
    import amfm_decompy.basic_tools as basic
    import amfm_decompy.pYAAPT as pYAAPT

    pad = (560 // 2 - HOP_SAMPLES)  # 35 ms frames: centre 280 samples after the frame start
    xp = np.concatenate([np.zeros(pad), x.astype(np.float64)])
    with np.errstate(all="ignore"):
        v = pYAAPT.yaapt(basic.SignalObj(xp, SAMPLE_RATE_HZ), f0_min=F0_MIN_HZ, f0_max=F0_MAX_HZ).samp_values
    n = -(-x.shape[0] // HOP_SAMPLES)
    out = np.zeros(n)
    m = min(len(v), n - 1)
    out[1:1 + m] = v[:m]
    return out


def harvest_f0(x: np.ndarray) -> np.ndarray:
    import pyworld

    f0, _ = pyworld.harvest(x.astype(np.float64), SAMPLE_RATE_HZ, f0_floor=F0_MIN_HZ, f0_ceil=F0_MAX_HZ,
                            frame_period=1000.0 * HOP_SAMPLES / SAMPLE_RATE_HZ)
    return f0


def praat_f0(x: np.ndarray) -> np.ndarray:
    import parselmouth

    p = parselmouth.Sound(x.astype(np.float64), SAMPLE_RATE_HZ).to_pitch(
        time_step=HOP_SAMPLES / SAMPLE_RATE_HZ, pitch_floor=F0_MIN_HZ, pitch_ceiling=F0_MAX_HZ)
    n = -(-x.shape[0] // HOP_SAMPLES)
    return np.nan_to_num(np.array([p.get_value_at_time(k * HOP_SAMPLES / SAMPLE_RATE_HZ) for k in range(n)]))


@dataclass
class Counts:
    gross: int = 0
    both_voiced: int = 0
    voicing_diff: int = 0
    frames: int = 0

    def add(self, est: np.ndarray, ref: np.ndarray) -> None:
        n = min(est.shape[0], ref.shape[0])
        est, ref = est[:n], ref[:n]
        both = (est > 0) & (ref > 0)
        self.gross += int(np.sum(np.abs(est[both] / ref[both] - 1.0) > 0.2))
        self.both_voiced += int(both.sum())
        self.voicing_diff += int(np.sum((est > 0) != (ref > 0)))
        self.frames += n

    @property
    def gpe(self) -> float:
        return 100.0 * self.gross / max(1, self.both_voiced)

    @property
    def vde(self) -> float:
        return 100.0 * self.voicing_diff / max(1, self.frames)


@dataclass
class Report:
    accuracy: dict = field(default_factory=dict)  # (corpus, tracker) -> Counts
    seconds: dict = field(default_factory=dict)  # tracker -> wall seconds (batch)
    cpu_seconds: dict = field(default_factory=dict)  # tracker -> process CPU seconds (batch, all threads)
    audio_s: float = 0.0
    parity_frames: int = 0
    parity_voicing_same: int = 0
    parity_max_cents: float = 0.0
    stream: dict = field(default_factory=dict)  # kernel -> (p50, p99 wall us, p50, p99 cpu us)
    numba_first_call_s: float = 0.0
    skipped: list = field(default_factory=list)


def _stream_cost(x: np.ndarray, kernel: str, config: F0Config, chunk: int) -> np.ndarray:
    from rtanon.f0.tracker import F0Tracker

    tr = F0Tracker(config, hop=chunk, kernel=kernel)
    n = x.shape[0] // chunk * chunk
    blocks = np.ascontiguousarray(x[:n], np.float32).reshape(-1, chunk)
    tr.process(blocks[0])
    wall = np.empty(blocks.shape[0])
    cpu = np.empty(blocks.shape[0])
    for i, b in enumerate(blocks):
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        tr.process(b)
        c1, t1 = time.thread_time_ns(), time.perf_counter_ns()
        wall[i], cpu[i] = (t1 - t0) / 1e3, (c1 - c0) / 1e3
    return wall, cpu


def run_benchmark(data: Path, n_files: int, config: F0Config | None = None, chunk_ms: int = 20,
                  progress=print, other_references: bool = True) -> Report:
    """``n_files`` per corpus, evenly spaced (0: every file); ``other_references=False`` skips harvest
    and Praat (pYAAPT, the reference of the GPE/VDE and speed figures, always runs)."""
    from rtanon.io.audio import read_audio
    from rtanon.f0.tracker import cpp_available, track
    from rtanon.io.kaldi import KaldiDir

    config = config or F0Config()
    rep = Report()
    kernels = ["cpp", "numba"] if cpp_available() else ["numba"]
    if "cpp" not in kernels:
        rep.skipped.append("C++ kernel: rtanon._core.F0Kernel not built (run scripts/dev-build.sh or pip install .)")
    refs = {"harvest": harvest_f0, "praat": praat_f0} if other_references else {}
    if not other_references:
        rep.skipped.append("harvest, Praat: not asked for (--references yaapt)")
    for name, mod in (("harvest", "pyworld"), ("praat", "parselmouth")):
        if name not in refs:
            continue
        try:
            __import__(mod)
        except ImportError:
            refs.pop(name)
            rep.skipped.append(f"{name}: `{mod}` not installed (pip install "
                               f"{'pyworld-prebuilt' if mod == 'pyworld' else 'praat-parselmouth'})")
    t0 = time.perf_counter()
    track(np.zeros(1600, np.float32), config, kernel="numba")  # JIT compile or cache load
    rep.numba_first_call_s = time.perf_counter() - t0
    if "cpp" in kernels:
        track(np.zeros(1600, np.float32), config, kernel="cpp")
    all_audio = []
    for corpus in ("so762_dev", "libri_clips"):
        kd = KaldiDir.load(Path(data) / corpus)
        utts = sorted(kd.wav)
        if n_files:
            utts = utts[:: max(1, len(utts) // n_files)][:n_files]
        for i, utt in enumerate(utts):
            x = read_audio(kd.wav[utt])
            all_audio.append(x)
            rep.audio_s += x.shape[0] / SAMPLE_RATE_HZ
            t, c = time.perf_counter(), time.process_time()
            ref = yaapt_f0(x)
            rep.seconds["pyaapt"] = rep.seconds.get("pyaapt", 0.0) + time.perf_counter() - t
            rep.cpu_seconds["pyaapt"] = rep.cpu_seconds.get("pyaapt", 0.0) + time.process_time() - c
            ests = {}
            for k in kernels:
                t, c = time.perf_counter(), time.process_time()
                ests[k] = track(x, config, kernel=k)
                rep.seconds[k] = rep.seconds.get(k, 0.0) + time.perf_counter() - t
                rep.cpu_seconds[k] = rep.cpu_seconds.get(k, 0.0) + time.process_time() - c
            for name, fn in refs.items():
                ests[name] = fn(x)
            for name, est in ests.items():
                rep.accuracy.setdefault((corpus, name), Counts()).add(est, ref)
            if len(kernels) == 2:
                a, b = ests["cpp"], ests["numba"]
                rep.parity_frames += a.shape[0]
                rep.parity_voicing_same += int(np.sum((a > 0) == (b > 0)))
                both = (a > 0) & (b > 0)
                if both.any():
                    rep.parity_max_cents = max(rep.parity_max_cents,
                                               float(np.max(np.abs(1200 * np.log2(a[both] / b[both])))))
            progress(f"  {corpus} {i + 1}/{len(utts)} {utt}")
    audio = np.concatenate(all_audio)
    chunk = chunk_ms * SAMPLE_RATE_HZ // 1000
    for k in kernels:
        wall, cpu = _stream_cost(audio, k, config, chunk)
        rep.stream[k] = (np.percentile(wall, 50), np.percentile(wall, 99), np.percentile(cpu, 50),
                         np.percentile(cpu, 99), wall.shape[0])
    return rep


def format_report(rep: Report, config: F0Config, chunk_ms: int) -> str:
    lines = [f"F0 tracker vs pYAAPT (window {config.window_ms} ms, spectral window {config.spectral_window_ms} ms, "
             f"decision lag {config.decision_lag_frames} frames, lookahead {config.lookahead_ms} ms)", "",
             "| corpus | tracker | GPE % (target <= 3) | VDE % (target <= 10) | frames | voiced in both |",
             "|---|---|---|---|---|---|"]
    for (corpus, name), c in rep.accuracy.items():
        label = {"cpp": "rtanon C++", "numba": "rtanon Numba", "harvest": "pyworld harvest",
                 "praat": "Praat (parselmouth)"}[name]
        lines.append(f"| {corpus} | {label} | {c.gpe:.2f} | {c.vde:.2f} | {c.frames} | {c.both_voiced} |")
    lines += ["", f"Speed, batch (whole files), same {rep.audio_s:.1f} s of audio in this run; CPU = process "
                  "CPU time over all threads (pYAAPT's NumPy may use several), wall = elapsed:", "",
              "| tracker | CPU s | CPU s per audio s | speed-up, CPU (target >= 100) | wall s | speed-up, wall |",
              "|---|---|---|---|---|---|"]
    base, base_w = rep.cpu_seconds.get("pyaapt", float("nan")), rep.seconds.get("pyaapt", float("nan"))
    for name in ("pyaapt", "cpp", "numba"):
        if name in rep.seconds:
            c, w = rep.cpu_seconds[name], rep.seconds[name]
            lines.append(f"| {name} | {c:.2f} | {c / rep.audio_s:.2e} | {base / c:.0f}x | {w:.2f} | {base_w / w:.0f}x |")
    lines += ["", f"Streaming cost per {chunk_ms} ms chunk (target p99 <= 100 us), wall and thread CPU time:", "",
              "| kernel | chunks | wall p50 us | wall p99 us | CPU p50 us | CPU p99 us |", "|---|---|---|---|---|---|"]
    for k, (w50, w99, c50, c99, n) in rep.stream.items():
        lines.append(f"| {k} | {n} | {w50:.1f} | {w99:.1f} | {c50:.1f} | {c99:.1f} |")
    if rep.parity_frames:
        lines += ["", f"C++/Numba parity: same voicing on {100.0 * rep.parity_voicing_same / rep.parity_frames:.3f} % "
                      f"of {rep.parity_frames} frames; max F0 difference where both voiced "
                      f"{rep.parity_max_cents:.2e} cents."]
    lines.append(f"Numba first call in this process (JIT compile, or load from the cache): "
                 f"{rep.numba_first_call_s:.2f} s.")
    for s in rep.skipped:
        lines.append(f"Skipped: {s}")
    return "\n".join(lines)
