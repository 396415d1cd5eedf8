"""``rtanon bench --serve``: how many live sessions one ``rtanon serve`` holds.

Each trial starts a fresh ``rtanon serve`` (a child process on loopback, a private token), opens N
sessions that stream real speech in real time (:func:`rtanon.serve.client.load_run`), and reads
back what the server counted: per-tick compute (p50/p99), ticks over 20 ms, frames answered with
comfort noise because they were late (missed deadlines), and each frame's round trip as the
client saw it. A trial holds when no session missed a deadline and every frame came back. The
ramp doubles N until a trial fails, then bisects between the last that held and the first that
did not. A one-session trial first gives the per-session cost alone, the reference for the ratio.
The load generator runs on the same machine and takes its own share of the CPU.
"""

from __future__ import annotations

import asyncio
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
    if args.serve_threads:
        out += ["--threads", str(args.serve_threads)]
    if args.vocoder:
        out += ["--vocoder", args.vocoder]
    if args.content:
        out += ["--content", args.content]
    return out
