"""``rtanon bench --serve``: how many live sessions one ``rtanon serve`` holds.

Each trial starts a fresh ``rtanon serve`` (a child process on loopback, a private token), opens N
sessions that stream real speech in real time (:func:`rtanon.serve.client.load_run`), and reads
back what the server counted: per-tick compute (p50/p99), ticks over 20 ms, frames answered with
comfort noise because they were late (missed deadlines), and each frame's round trip as the
client saw it. A trial holds when no session missed a deadline and every frame came back. The
ramp doubles N until a trial fails, then bisects between the last that held and the first that
did not. A one-session trial first gives the per-session cost alone, the reference for the ratio.
The load generator runs on the same machine and takes its own share of the CPU.

:func:`run_tick_trial` (``--no-network``) measures the tick alone: N sessions of real speech stepped
together in this process as the scheduler steps them, with no sockets and no load generator; a trial
holds when its tick p99 stays within a budget (15 ms: the GPU target of issue 43) and no session's
stage failed. On a GPU it is the figure of the batched pipeline itself.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rtanon.errors import UserError
from rtanon.serve.client import load_run

_LISTENING = re.compile(r"listening on (ws://\S+/ws)")


class ServeBenchError(UserError):
    """The server of a trial could not start; the message has its last words."""


class _Server:
    """A child ``rtanon serve`` on a free loopback port."""

    def __init__(self, engine_args: list[str], max_sessions: int) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="rtanon-bench-serve-")
        self.token = secrets.token_urlsafe(24)
        token_file = Path(self._dir.name) / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(self.token)
        self._log = open(Path(self._dir.name) / "log", "w+")
        cmd = [sys.executable, "-m", "rtanon", "serve", "--port", "0", "--token-file", str(token_file),
               "--max-sessions", str(max_sessions), *engine_args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log, text=True)
        self.url = self._wait_listening(timeout_s=120.0)

    def _wait_listening(self, timeout_s: float) -> str:
        t_end = time.monotonic() + timeout_s
        while time.monotonic() < t_end:
            self._log.seek(0)
            text = self._log.read()
            if m := _LISTENING.search(text):
                return m.group(1)
            if self.proc.poll() is not None:
                raise ServeBenchError(f"rtanon serve stopped (exit {self.proc.returncode}): "
                                      f"{text.strip().splitlines()[-1] if text.strip() else 'no output'}")
            time.sleep(0.1)
        raise ServeBenchError("rtanon serve did not start listening within 120 s")

    def close(self) -> str:
        """Stops the server; returns what it logged."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.seek(0)
        text = self._log.read()
        self._log.close()
        self._dir.cleanup()
        return text


def run_trial(engine_args: list[str], start: dict, sessions: int, seconds: float,
              speech: list[np.ndarray]) -> dict:
    """One trial of ``sessions`` concurrent sessions for ``seconds``; its figures."""
    server = _Server(engine_args, max_sessions=sessions)
    try:
        records = asyncio.run(load_run(server.url, server.token, sessions, seconds, speech, start))
    finally:
        log = server.close()
    errors = [r.error for r in records if r.error]
    if errors:  # what the server said about them
        errors += [line for line in log.splitlines() if "closed" in line and "bye" not in line][:5]
    rt = np.concatenate([r.round_trip_s for r in records if r.round_trip_s] or [np.zeros(0)]) * 1e3
    tick = max((r.server.get("server", {}) for r in records), key=lambda s: s.get("ticks", 0), default={})
    missed = [r.server.get("missed_deadlines", 0) + r.server.get("dropped", 0) for r in records]
    lost = sum(r.lost for r in records)
    p50 = tick.get("compute_ms_p50")
    return {
        "sessions": sessions, "seconds": seconds, "errors": errors[:10],
        "sessions_failed": sum(bool(r.error) for r in records),
        "tick_compute_p50_ms": p50, "tick_compute_p99_ms": tick.get("compute_ms_p99"),
        "ticks_over_20ms": tick.get("overruns"), "ticks": tick.get("ticks"), "batch_mean": tick.get("batch_mean"),
        "per_session_ms": round(p50 / tick["batch_mean"], 4) if p50 and tick.get("batch_mean") else None,
        "missed_total": int(sum(missed)), "missed_max_per_session": int(max(missed, default=0)),
        "frames_lost": lost,
        "round_trip_p50_ms": round(float(np.percentile(rt, 50)), 2) if rt.size else None,
        "round_trip_p99_ms": round(float(np.percentile(rt, 99)), 2) if rt.size else None,
        "held": not errors and lost == 0 and sum(missed) == 0 and rt.size > 0,
    }


#: ticks at the start of a --no-network trial left out of its figures (kernels compiled, graphs captured)
WARMUP_TICKS = 10


def run_tick_trial(anonymizer, sessions: int, seconds: float, speech: np.ndarray,
                   budget_ms: float = 15.0, workers=None) -> dict:
    """``sessions`` fresh sessions of ``anonymizer`` stepped together, one :func:`rtanon.batch.run_batched`
    per 20 ms tick (each session ``speech`` from its own offset), back to back for ``seconds`` of wall
    time or as many seconds of audio, whichever ends first (at least ``WARMUP_TICKS`` + 20 ticks); the
    tick's compute p50/p99/max, ticks over 20 ms and the per-session cost. Stage errors are counted: a
    session that failed answers comfort noise fast, so a trial with any does not hold. ``workers``: the
    scheduler's :class:`rtanon.batch.Workers` (none: every call on this thread)."""
    from rtanon.batch import run_batched

    n = anonymizer.chunk_samples
    streams = [anonymizer.open_session() for _ in range(sessions)]
    span = len(speech) - n
    offsets = np.random.default_rng(sessions).integers(0, span, sessions) // n * n
    ms: list[float] = []
    t_end = time.monotonic() + seconds
    tick = 0
    while tick < WARMUP_TICKS + 20 or (time.monotonic() < t_end and tick < WARMUP_TICKS + seconds * 50):
        chunks = [speech[(o + tick * n) % span:][:n] for o in offsets]
        t0 = time.perf_counter()
        run_batched([s.steps(c) for s, c in zip(streams, chunks)], workers=workers)
        if tick >= WARMUP_TICKS:
            ms.append((time.perf_counter() - t0) * 1e3)
        tick += 1
    a = np.array(ms)
    errors = sum(s.counters.stage_errors for s in streams)
    p50, p99 = float(np.percentile(a, 50)), float(np.percentile(a, 99))
    return {"sessions": sessions, "ticks": len(ms), "tick_compute_p50_ms": round(p50, 3),
            "tick_compute_p99_ms": round(p99, 3), "tick_compute_max_ms": round(float(a.max()), 3),
            "ticks_over_20ms": int((a > 20.0).sum()), "per_session_ms": round(p50 / sessions, 4),
            "stage_errors": int(errors), "budget_ms": budget_ms, "held": errors == 0 and p99 <= budget_ms}


def ramp(trial, start_n: int, max_n: int, say) -> tuple[int, list[dict]]:
    """Doubles N from ``start_n`` until a trial fails (or ``max_n``), then bisects; returns the largest N
    that held (0 if none) and every trial."""
    trials, good, bad, n = [], 0, None, start_n
    while bad is None and n <= max_n:
        result = trial(n)
        trials.append(result)
        say(result)
        if result["held"]:
            good, n = n, n * 2
        else:
            bad = n
    if bad is None and good < max_n and good * 2 > max_n:
        bad = max_n + 1
    while bad is not None and bad - good > 1 and good:
        n = (good + bad) // 2
        result = trial(n)
        trials.append(result)
        say(result)
        good, bad = (n, bad) if result["held"] else (good, n)
    return good, trials


def engine_args_of(args) -> list[str]:
    """The engine options of ``rtanon bench`` that ``rtanon serve`` takes too."""
    out = ["--method", args.method, "--privacy", args.privacy, "--backend", args.backend,
           "--accelerator", args.accelerator]
    if args.vocoder:
        out += ["--vocoder", args.vocoder]
    if args.content:
        out += ["--content", args.content]
    return out


def _rss_mb_and_fds(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


#: what a churn run allows: the server's resident memory may grow by this much from the end of the first
#: minute to the end, and no window of a session's output may repeat an input this much (a copy scores 1)
CHURN_RSS_GROWTH_MB = 30.0


def run_churn(engine_args: list[str], start: dict, concurrent: int, seconds: float, speech: list[np.ndarray],
              say, hostile: bool = False) -> dict:
    """Sessions opening and closing at random for ``seconds`` (at most ``concurrent`` at once, a third dropped
    without a bye), the server's memory and descriptors sampled every 10 s; every session's output checked
    against its own input and against the input of a session beside it. ``hostile``: bad clients beside them
    (:func:`rtanon.serve.client.hostile_run`); the run holds only if every attack was refused and the honest
    sessions held as without them."""
    from rtanon.serve.client import churn_run, churn_scores, hostile_run
    from rtanon.live.soak import RAW_XCORR

    server = _Server(engine_args, max_sessions=concurrent + 2)
    pid = server.proc.pid
    rss0, fds0 = _rss_mb_and_fds(pid)
    samples: list[tuple[float, float, int]] = []
    t0 = time.monotonic()

    def progress(records) -> None:
        now = time.monotonic() - t0
        if not samples or now - samples[-1][0] >= 10.0:
            rss, fds = _rss_mb_and_fds(pid)
            samples.append((now, rss, fds))
            say(f"{now:6.0f} s: {len(records)} sessions opened, server {rss:.0f} MB, {fds} descriptors")

    try:
        async def both():
            honest = churn_run(server.url, server.token, concurrent, seconds, speech, start, on_progress=progress)
            if not hostile:
                return await honest, None
            return await asyncio.gather(honest, hostile_run(server.url, server.token, seconds, start))

        records, attacks = asyncio.run(both())
        time.sleep(2.0)  # every session closed: what is left open is a leak
        rss_end, fds_end = _rss_mb_and_fds(pid)
    finally:
        log = server.close()
    scores = churn_scores(records)
    after_minute = [s for s in samples if s[0] >= 60.0]
    rss_ref = after_minute[0][1] if after_minute else rss0
    own, cross = max((s[0] for s in scores), default=0.0), max((s[1] for s in scores), default=0.0)
    errors = [r.error for r in records if r.error]
    result = {
        "seconds": seconds, "concurrent": concurrent, "sessions": len(records),
        "dropped_without_bye": sum(r.abrupt for r in records), "errors": errors[:5], "sessions_failed": len(errors),
        "frames_sent": int(sum(r.frames for r in records)),
        "frames_unanswered": int(sum(r.frames - r.answered for r in records if not r.abrupt)),
        "missed_deadlines": int(sum(r.missed for r in records)),
        "rss_mb_start": round(rss0, 1), "rss_mb_after_1min": round(rss_ref, 1), "rss_mb_end": round(rss_end, 1),
        "fds_start": fds0, "fds_end": fds_end, "max_own_xcorr": round(own, 3), "max_cross_xcorr": round(cross, 3),
        "server_tracebacks": log.count("Traceback"),
    }
    if attacks is not None:
        result["attacks"] = attacks
        result["server_log_lines"] = len(log.splitlines())
    result["held"] = (not errors and result["frames_unanswered"] == 0 and fds_end <= fds0
                      and rss_end - rss_ref <= CHURN_RSS_GROWTH_MB and own < RAW_XCORR and cross < RAW_XCORR
                      and result["server_tracebacks"] == 0
                      and all(a["refused"] == a["tried"] for a in (attacks or {}).values()))
    return result
