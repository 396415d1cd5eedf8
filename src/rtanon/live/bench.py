"""End-to-end benchmarks of the live loop (``rtanon bench --live-seconds`` and ``--e2e``).

``bench_live_loop`` drives ``LiveCore`` (ring buffers, worker thread, jitter buffer) with input and output
callbacks at real-time pace, as a sound card would, and counts the missed deadlines.

``measure_e2e`` measures microphone-to-virtual-microphone latency through a
private PulseAudio (or PipeWire) daemon: a fake microphone (null sink monitor)
fed with looped speech, ``rtanon live`` between it and the rtanon virtual
device, and both the fake microphone and the rtanon microphone recorded in one
process with PortAudio timestamps. The delay comes from cross-correlating their
energy envelopes (robust to the voice change) window by window; beside it, the
parts that ``rtanon live`` reports (algorithmic, compute, its output queue, the
audio server's input and output latency) make the delay budget.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ
from rtanon.engine import Anonymizer


def bench_live_loop(anonymizer: Anonymizer, signal: np.ndarray, seconds: float, block_ms: int = 10) -> dict:
    """A simulated live loop at the configured chunk size: ``rtanon live``'s ``LiveCore`` (ring
    buffers, worker thread, jitter buffer) driven by input and output callbacks of ``block_ms`` at
    real-time pace, as a sound card would, for ``seconds``. A missed deadline is an output callback
    that found the worker's audio not ready (it played comfort noise instead)."""
    from rtanon.live.core import LiveCore

    session = anonymizer.open_session(seed=0)
    core = LiveCore(session, SAMPLE_RATE_HZ, SAMPLE_RATE_HZ)
    block = SAMPLE_RATE_HZ * block_ms // 1000
    n = int(seconds * 1000 / block_ms)
    x = np.resize(signal.astype(np.float32), (n + 1) * block)
    out = np.empty(block, np.float32)
    late = []  # how far behind its clock each callback ran (the benchmark thread itself can be late)
    core.start()
    t0 = time.perf_counter()
    try:
        for i in range(n):
            wait = t0 + (i + 1) * block_ms / 1000 - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            late.append(max(0.0, -wait))
            core.on_input(x[i * block : (i + 1) * block])
            core.on_output(out)
    finally:
        core.stop()
    c = session.counters
    return {"live_seconds": n * block_ms / 1000, "callbacks": n, "missed_deadlines": c.missed_deadlines,
            "missed_pct": 100.0 * c.missed_deadlines / max(1, n), "input_skips": core.input_skips,
            "drift_trims": core.drift_trims, "worker_errors": core.worker_errors, "stage_errors": c.stage_errors,
            "callback_late_max_ms": 1000.0 * max(late, default=0.0)}


MIN_REFERENCE_XCORR = 0.6
#: the measured delay: one figure per window of speech (hop half a window), their median and 99th percentile
E2E_WINDOW_S, E2E_SETTLE_S, E2E_MAX_DELAY_S = 4.0, 2.0, 0.5
#: a window carries speech when its level is above this
E2E_SPEECH_DBFS = -40.0
#: the parts of the delay, in the order the table adds them: live's status field and what it is
DELAY_PARTS = (("algorithmic_ms", "algorithmic (chunk + lookahead)"),
               ("compute_p50_ms", "compute per chunk (median)"),
               ("queue_wait_ms", "rtanon's output queue (median wait)"),
               ("device_in_ms", "input latency (audio server)"),
               ("device_out_ms", "output latency (audio server)"))


def measure_e2e(method: str, chunk_ms: int, seconds: float = 20.0, seed: int = 0, attempts: int = 3,
                server: str = "pulseaudio", progress=None) -> dict:
    """Microphone-to-virtual-microphone delay through a private sound server (``server``: a name of
    ``rtanon.live.pulse.DAEMONS``, PulseAudio or PipeWire with pipewire-pulse) over ``seconds`` of looped
    speech, with its budget: the parts ``rtanon live`` reports (``DELAY_PARTS``, medians of its status)
    beside the delay measured from the recordings (per window). The recording of the fake microphone is
    the reference: when it is not a faithful copy of what was played (a busy machine drops its samples),
    measure again, at most ``attempts`` times in all; ``attempts`` in the result says how many it took.
    ``progress(text)``: called about once a second."""
    for attempt in range(1, attempts + 1):
        result = _measure_e2e_once(method, chunk_ms, seconds, seed, server, progress)
        if result["xcorr_mic_vs_played"] > MIN_REFERENCE_XCORR:
            break
    return {**result, "attempts": attempt}


def _measure_e2e_once(method: str, chunk_ms: int, seconds: float, seed: int, server: str, progress) -> dict:
    import json
    import os
    import queue
    import threading

    from rtanon.live import pulse
    from rtanon.eval.signal import max_xcorr
    from rtanon.io.audio import read_audio
    from rtanon.io.resources import demo_speech_path
    from rtanon.live.soak import pump_lines

    with demo_speech_path() as p:
        utterance = read_audio(p)
    played = np.concatenate((utterance, np.zeros(SAMPLE_RATE_HZ // 2, np.float32)))
    lines: queue.Queue = queue.Queue()
    with pulse.DAEMONS[server]() as pd:
        pd.load_null_sink("rtanon_fake_mic", SAMPLE_RATE_HZ)
        pulse.create(pd.env)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(pd.env)
        live = subprocess.Popen([sys.executable, "-m", "rtanon", "live", "--input", "pulse:rtanon_fake_mic.monitor",
                                 "--output", "rtanon", "--method", method, "--chunk-ms", str(chunk_ms),
                                 "--seed", str(seed), "--quiet", "--json-status", "--status-interval", "0.25",
                                 "--duration", str(seconds + 3.0)],
                                env=pd.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        player = pulse.LoopPlayer("rtanon_fake_mic", played, pd.env)
        err_tail: list[str] = []
        try:
            for line in live.stderr:  # wait until its streams are open
                err_tail.append(line)
                if "running" in line:
                    break
            else:
                raise RuntimeError(f"rtanon live exited at start-up: {''.join(err_tail)[-1500:]}")
            threading.Thread(target=pump_lines, args=(live.stdout, lines), daemon=True).start()
            threading.Thread(target=pump_lines, args=(live.stderr, None, err_tail), daemon=True).start()
            mic = pulse.SourceRecorder("rtanon_fake_mic.monitor")
            anon = pulse.SourceRecorder(pulse.SOURCE_NAME)
            with mic.stream, anon.stream:
                time.sleep(0.3)
                t_play = time.monotonic()
                player.start()
                while (left := seconds - (time.monotonic() - t_play)) > 0:
                    time.sleep(min(1.0, left))
                    if progress is not None:
                        progress(f"{min(seconds, time.monotonic() - t_play):5.0f}/{seconds:.0f} s")
                player.stop()
                time.sleep(0.8)
            live.wait(timeout=60)
        finally:
            player.stop()
            if live.poll() is None:
                live.kill()
                live.wait()
            os.environ.clear()
            os.environ.update(saved)
    status = []
    while not lines.empty():
        try:
            row = json.loads(lines.get()[1])
        except ValueError:  # the closing summary line
            continue
        status.append(row)
    t0 = min(mic.placed()[0][0], anon.placed()[0][0])
    x_mic, x_anon = mic.timeline(t0), anon.timeline(t0)
    n = min(x_mic.shape[0], x_anon.shape[0])
    windows, silent = _window_delays_ms(x_mic[:n], x_anon[:n], int((t_play - t0) * SAMPLE_RATE_HZ))
    steady = [r for r in status if r["t"] >= E2E_SETTLE_S] or status
    parts = {key: _median([r.get(key) for r in steady]) for key, _ in DELAY_PARTS}
    last = status[-1] if status else {}
    out_block_ms = last.get("out_block_ms", 10)
    blocks = max(1, int(1000 * last.get("t", seconds) / out_block_ms))  # the output callbacks
    missed = int(last.get("missed_deadlines", 0))
    return {"e2e_latency_ms": _median(windows), "e2e_p99_ms": _percentile(windows, 99), "e2e_windows": len(windows),
            "e2e_window_delays_ms": [round(d, 1) for d in windows], "e2e_silent_windows": silent,
            "e2e_seconds": seconds, "server": server, "method": method, "chunk_ms": chunk_ms,
            "delay_parts_ms": parts, "delay_parts_sum_ms": round(sum(v or 0.0 for v in parts.values()), 1),
            "missed_deadlines": missed, "missed_pct": 100.0 * missed / blocks, "out_block_ms": out_block_ms,
            "xruns": int(last.get("input_overflows", 0)) + int(last.get("output_underflows", 0)),
            "input_overflows": int(last.get("input_overflows", 0)),
            "output_underflows": int(last.get("output_underflows", 0)),
            "stuck_reopens": int(last.get("output_stuck", 0)),
            "overload_drops": int(last.get("overload_drops", 0)),
            "overloaded_statuses": sum(bool(r.get("overload")) for r in status),
            "recorded_s": n / SAMPLE_RATE_HZ,
            "xcorr_mic_vs_played": max_xcorr(utterance[: 3 * SAMPLE_RATE_HZ], x_mic),
            "xcorr_anon_vs_played": max_xcorr(utterance[: 3 * SAMPLE_RATE_HZ], x_anon),
            "recorder_overflows": mic.overflows + anon.overflows,
            "live_summary": err_tail[-1].strip() if err_tail else ""}


def _window_delays_ms(x_mic: np.ndarray, x_anon: np.ndarray, start: int) -> tuple[list[float], int]:
    """The delay of ``x_anon`` behind ``x_mic`` in each window (hop half a window) from ``start`` on where
    the microphone carries speech, and how many such windows the virtual microphone carried none in (an
    outage: no delay to measure there)."""
    from rtanon.eval.signal import envelope_delay_s

    w = int(E2E_WINDOW_S * SAMPLE_RATE_HZ)
    out, silent = [], 0
    for i in range(max(0, start), x_mic.shape[0] - w + 1, w // 2):
        if _dbfs(x_mic[i : i + w]) <= E2E_SPEECH_DBFS:
            continue
        if _dbfs(x_anon[i : i + w]) <= E2E_SPEECH_DBFS:  # comfort noise sits at -66 dBFS, speech near -25
            silent += 1
            continue
        out.append(1000.0 * envelope_delay_s(x_mic[i : i + w], x_anon[i : i + w], max_delay_s=E2E_MAX_DELAY_S))
    return out, silent


def _dbfs(x: np.ndarray) -> float:
    return 20.0 * float(np.log10(max(float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))), 1e-9)))


def _median(values) -> float | None:
    return _percentile(values, 50)


def _percentile(values, q: float) -> float | None:
    values = [v for v in values if v is not None]
    return round(float(np.percentile(values, q)), 2) if values else None
