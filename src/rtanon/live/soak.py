"""The soak test: ``rtanon live`` for a long time through a private PulseAudio
daemon, with speech as the microphone, while faults are injected on a schedule.

The wiring (all inside a ``PulseDaemon``, never the user's sound server)::

    speech --pacat--> soak_fake_mic (null sink) --monitor--> soak_mic (remap source)
        --> rtanon live --> soak_out (remap sink) --> soak_anon (null sink)

``soak_mic`` and ``soak_out`` are the devices that disappear and come back;
the two recorders listen to ``soak_fake_mic.monitor`` (what the microphone
said) and ``soak_anon.monitor`` (what rtanon played), each block placed on the
soak's monotonic clock from PortAudio's capture timestamps.

Faults (``FAULTS``): ``cpu`` (busy processes, two per core), ``storm`` (every
chunk's stages raise: ``live --fault-injection`` and SIGUSR1/SIGUSR2),
``input`` (the microphone's module unloaded, then reloaded), ``output`` (the
output sink's module unloaded, then reloaded), ``stop`` (SIGSTOP, 1 s,
SIGCONT). Figures (``analyze``):

- end-to-end delay per 10 s window (those clear of faults) from the speech envelope (the syllable
  onsets after the pauses between utterances are the markers; a click or
  tone would be gated by the VAD), and its drift: the median over the first
  5 minutes against the last 5 (a fifth of the run each when shorter);
- missed deadlines, xruns, stage and worker errors (``live --json-status``);
- resident memory of the live process every second, and its growth (median
  of the last 5 minutes minus median of the first 5 after start-up);
- recovery after each fault: the time until ``live`` reports both streams
  up again (its status every 0.1 s; device faults and SIGSTOP), plus, from
  the first clear speech after that (above -35 dBFS; a fading tail the
  output may gate is not a test of recovery) of the microphone
  after the fault ended, plus the fault-free delay, to the first speech in the
  output; minus the same lag measured at fault-free onsets;
- the maximum normalised cross-correlation of the output with the
  microphone, per 5 s window over lags 0 to 1.5 s (raw voice scores near 1;
  the neural method's own level reaches about 0.26 in an hour, McAdams' 0.5),
  and the raw-voice check (``raw_voice_check``): the windows during and after
  faults against the same run's fault-free ones (their 99.9th percentile plus
  ``XCORR_MARGIN``, never below the method's ``max_xcorr`` target), and every
  window against ``RAW_XCORR``, the level a raw
  copy of the microphone exceeds however late it comes.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from rtanon.constants import SAMPLE_RATE_HZ

RATE = SAMPLE_RATE_HZ
FAKE_MIC, MIC, OUT, ANON = "soak_fake_mic", "soak_mic", "soak_out", "soak_anon"
FAULTS = ("cpu", "storm", "input", "output", "stop")
FAULT_SECONDS = {"cpu": 10.0, "storm": 3.0, "input": 3.0, "output": 3.0, "stop": 1.0}
WARMUP_S = 15.0  # start-up before the first fault (the neural method's models load first)
TAIL_S = 10.0  # fault-free time at the end
SPEECH_DBFS = -50.0  # output: 20 ms frames above this are not comfort noise (which sits at -66 dBFS)
MIC_SPEECH_DBFS = -35.0  # microphone: clear speech (so762_dev averages -25 dBFS), not a fading tail
DELAY_WINDOW_S, XCORR_WINDOW_S, MAX_DELAY_S = 10.0, 5.0, 1.5
#: targets of issue 27; ``max_xcorr`` is the raw-voice limit where a run has no fault-free window, and the
#: lowest limit where it has some
TARGETS = {"drift_ms": 5.0, "rss_growth_mb": 5.0, "recovery_s": 1.0,
           "max_xcorr": {"neural": 0.2, "mcadams": 0.5}}
#: The raw-voice check (issue 44): a fault window may correlate with the microphone up to the fault-free
#: windows' XCORR_PERCENTILE plus XCORR_MARGIN (a fault that lets the input through raises it; the method's
#: own level, which varies with the voice and the speech, does not); no window may reach RAW_XCORR, which a
#: raw copy of the microphone exceeds at any delay up to MAX_DELAY_S.
XCORR_PERCENTILE, XCORR_MARGIN, RAW_XCORR = 99.9, 0.1, 0.95


class SoakError(RuntimeError):
    pass


@dataclass
class Fault:
    name: str
    start_s: float  # on the soak's clock (seconds since the live process started)
    duration_s: float
    end_s: float = 0.0  # measured when the fault was lifted


def schedule(duration_s: float, period_s: float | None = None) -> list[Fault]:
    """Every fault in turn, from ``WARMUP_S`` on, one every ``period_s``
    (default: one a minute, closer when needed so each fault happens at least
    once), the last one ending at least ``TAIL_S`` before the end."""
    usable = duration_s - WARMUP_S - TAIL_S
    period = period_s or min(60.0, max(1.0, usable) / len(FAULTS))
    out, t, i = [], WARMUP_S, 0
    while t + FAULT_SECONDS[FAULTS[i % len(FAULTS)]] <= duration_s - TAIL_S:
        name = FAULTS[i % len(FAULTS)]
        out.append(Fault(name, t, FAULT_SECONDS[name]))
        t += max(period, FAULT_SECONDS[name] + 3.0)
        i += 1
    if len(out) < len(FAULTS):
        raise SoakError(f"{duration_s:.0f} s with a fault every {period:.0f} s leaves no room for every fault "
                        "once; use a longer --duration (at least 60 s) or a shorter --period")
    return out


def speech_for_soak(paths: list[str], gap_s: float = 0.5) -> np.ndarray:
    """The utterances in ``paths`` (any audio rtanon reads), each followed by ``gap_s`` of silence."""
    from rtanon.io.audio import read_audio

    gap = np.zeros(int(gap_s * RATE), np.float32)
    parts = []
    for p in paths:
        parts += [read_audio(p), gap]
    return np.concatenate(parts)


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


@dataclass
class SoakRun:
    method: str
    duration_s: float
    faults: list[Fault]
    status: list[dict] = field(default_factory=list)  # live's JSON status lines, with "t_soak"
    rss: list[tuple[float, float]] = field(default_factory=list)
    live_rc: int | None = None
    live_stderr_tail: str = ""
    recorders: dict = field(default_factory=dict)  # how each recording was placed (SourceRecorder.run_summary)


def run(speech: np.ndarray, duration_s: float, method: str = "neural", *, seed: int | None = None,
        period_s: float | None = None, progress=None, extra_live_args: tuple[str, ...] = (),
        keep_dir: str | None = None) -> dict:
    """Runs the soak and returns ``analyze``'s report. ``progress(text)`` is called about once a second.
    ``keep_dir``: also write the two recordings (``mic.flac``, ``output.flac``) and the raw run
    (``run.json``: faults, status lines, memory samples) there, for a second look."""
    from rtanon.live import pulse

    faults = schedule(duration_s, period_s)
    soak = SoakRun(method, duration_s, faults)
    busy: list[subprocess.Popen] = []
    with pulse.PulseDaemon() as pd:
        pd.load_null_sink(FAKE_MIC, RATE)
        pd.load_null_sink(ANON, RATE)
        mic_args = ["module-remap-source", f"master={FAKE_MIC}.monitor", f"source_name={MIC}"]
        out_args = ["module-remap-sink", f"master={ANON}", f"sink_name={OUT}", "channels=1"]
        mods = {"input": pd.pactl("load-module", *mic_args).strip(),
                "output": pd.pactl("load-module", *out_args).strip()}
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(pd.env)
        import sounddevice as sd

        sd._terminate()  # PortAudio lists the ALSA "pulse" device only if the daemon answered at initialisation
        sd._initialize()
        cmd = [sys.executable, "-m", "rtanon", "live", "--input", f"pulse:{MIC}", "--output", f"pulse:{OUT}",
               "--method", method, "--quiet", "--json-status", "--status-interval", "0.1", "--fault-injection",
               "--duration", str(duration_s), *extra_live_args]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        player = pulse.LoopPlayer(FAKE_MIC, speech, pd.env)
        live = subprocess.Popen(cmd, env=pd.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        err_tail: list[str] = []
        try:
            for line in live.stderr:  # wait until its streams are open
                err_tail.append(line)
                if "running" in line:
                    break
            else:
                raise SoakError(f"rtanon live exited at start-up: {''.join(err_tail)[-1500:]}")
            threading.Thread(target=pump_lines, args=(live.stdout, lines), daemon=True).start()
            threading.Thread(target=pump_lines, args=(live.stderr, None, err_tail), daemon=True).start()
            mic, anon = pulse.SourceRecorder(f"{FAKE_MIC}.monitor"), pulse.SourceRecorder(f"{ANON}.monitor")
            with mic.stream, anon.stream:
                t0 = time.monotonic()
                player.start()
                pending = list(faults)
                active: list[tuple[Fault, callable]] = []
                last_progress = 0.0
                while True:
                    now = time.monotonic() - t0
                    if now >= duration_s or live.poll() is not None:
                        break
                    while pending and pending[0].start_s <= now:
                        f = pending.pop(0)
                        f.start_s = now
                        active.append((f, _start_fault(f, live, pd, mods, mic_args, out_args, busy)))
                    for f, lift in list(active):
                        if now >= f.start_s + f.duration_s:
                            lift()
                            f.end_s = time.monotonic() - t0
                            active.remove((f, lift))
                    rss = _rss_mb(live.pid)
                    if rss is not None and (not soak.rss or now - soak.rss[-1][0] >= 1.0):
                        soak.rss.append((now, rss))
                    while not lines.empty():
                        t_line, text = lines.get()
                        try:
                            row = json.loads(text)
                        except ValueError:
                            continue
                        row["t_soak"] = t_line - t0
                        soak.status.append(row)
                    if progress is not None and now - last_progress >= 1.0:
                        last_progress = now
                        st = soak.status[-1] if soak.status else {}
                        progress(f"{now:6.0f}/{duration_s:.0f} s | rss {soak.rss[-1][1] if soak.rss else 0:.0f} MB"
                                 f" | missed {st.get('missed_deadlines', 0)} | errors {st.get('stage_errors', 0)}"
                                 f" | faults done {len(faults) - len(pending) - len(active)}/{len(faults)}"
                                 f"{' | ' + ','.join(f.name for f, _ in active) if active else ''}")
                    time.sleep(0.05)
                for f, lift in active:
                    lift()
                    f.end_s = time.monotonic() - t0
                time.sleep(1.0)  # the tail still in flight
            n = int((time.monotonic() - t0) * RATE)
            x, y = mic.timeline(t0, n), anon.timeline(t0, n)
            soak.recorders = {"mic": mic.run_summary(t0), "output": anon.run_summary(t0)}
        finally:
            player.stop()
            for p in busy:
                if p.poll() is None:
                    p.kill()
            if live.poll() is None:
                os.kill(live.pid, signal.SIGCONT)
                live.terminate()
            try:
                live.wait(timeout=15)
            except subprocess.TimeoutExpired:
                live.kill()
                live.wait()
            os.environ.clear()
            os.environ.update(saved)
        soak.live_rc = live.returncode
        time.sleep(0.2)
        soak.live_stderr_tail = "".join(err_tail)[-2000:]
    if keep_dir is not None:
        keep(soak, x, y, keep_dir)
    return analyze(soak, x, y)


def keep(soak: SoakRun, x: np.ndarray, y: np.ndarray, directory: str) -> None:
    import soundfile as sf

    from rtanon.atomic import atomic_path, write_text

    os.makedirs(directory, exist_ok=True)
    for name, sig in (("mic.flac", x), ("output.flac", y)):
        with atomic_path(os.path.join(directory, name)) as tmp:
            sf.write(tmp, sig, RATE, format="FLAC", subtype="PCM_16")
    write_text(os.path.join(directory, "run.json"), json.dumps(asdict(soak)) + "\n")


def load_kept(directory: str) -> tuple[SoakRun, np.ndarray, np.ndarray]:
    """What ``keep`` wrote, for ``analyze``."""
    import soundfile as sf

    d = json.loads(open(os.path.join(directory, "run.json")).read())
    d["faults"] = [Fault(**f) for f in d["faults"]]
    x = sf.read(os.path.join(directory, "mic.flac"), dtype="float32")[0]
    y = sf.read(os.path.join(directory, "output.flac"), dtype="float32")[0]
    return SoakRun(**d), x, y


def pump_lines(stream, q: queue.Queue | None, tail: list[str] | None = None) -> None:
    """Reads a child's text stream to its end: each line, stamped, into ``q``, or the last 50 into ``tail``."""
    for line in stream:
        if q is not None:
            q.put((time.monotonic(), line))
        else:
            tail.append(line)
            del tail[:-50]


def _start_fault(f: Fault, live, pd, mods: dict, mic_args: list, out_args: list, busy: list):
    """Starts fault ``f``; returns the function that lifts it."""
    if f.name == "cpu":
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
        busy.extend(procs)

        def lift():
            for p in procs:
                p.kill()
                p.wait()
        return lift
    if f.name == "storm":
        os.kill(live.pid, signal.SIGUSR1)
        return lambda: os.kill(live.pid, signal.SIGUSR2)
    if f.name == "stop":
        os.kill(live.pid, signal.SIGSTOP)
        return lambda: os.kill(live.pid, signal.SIGCONT)
    if f.name in ("input", "output"):
        pd.pactl("unload-module", mods[f.name])

        def lift():
            mods[f.name] = pd.pactl("load-module", *(mic_args if f.name == "input" else out_args)).strip()
        return lift
    raise ValueError(f.name)


# -- analysis -------------------------------------------------------------------------------------

def _frames_db(x: np.ndarray, frame: int = 320) -> np.ndarray:
    n = x.shape[0] // frame
    e = np.square(x[: n * frame].astype(np.float64)).reshape(n, frame).mean(axis=1)
    return 10.0 * np.log10(e + 1e-12)


def _first_active(db: np.ndarray, start: int, run: int = 5, level_dbfs: float = SPEECH_DBFS) -> int | None:
    """First 20 ms frame at or after ``start`` that begins ``run`` frames above ``level_dbfs``."""
    active = db > level_dbfs
    for i in range(max(0, start), active.shape[0] - run):
        if active[i : i + run].all():
            return i
    return None


def _onset_lag_s(xdb, ydb, t_s: float, delay_s: float, horizon_s: float = 15.0) -> float | None:
    """From the microphone's first speech onset at or after ``t_s`` (plus ``delay_s``) to the output's."""
    fps = RATE / 320
    ix = _first_active(xdb, int(t_s * fps), level_dbfs=MIC_SPEECH_DBFS)
    if ix is None or ix / fps > t_s + horizon_s:
        return None
    iy = _first_active(ydb, int((ix / fps + delay_s - 0.1) * fps))
    return None if iy is None else iy / fps - ix / fps - delay_s


def raw_voice_check(fault_free: list[float], in_fault: list[float], method: str) -> dict:
    """Judges the windows' maximum normalised cross-correlations with the microphone (see the module
    docstring). ``ok`` None where there is no window at all."""
    target = TARGETS["max_xcorr"].get(method, 0.5)
    if fault_free:
        reference = float(np.percentile(fault_free, XCORR_PERCENTILE))
        # never stricter than the method's own target: a short run's few fault-free windows are a noisy
        # reference (a 60 s McAdams soak in CI: fault-free at most 0.318, a fault window 0.423)
        limit = min(max(reference + XCORR_MARGIN, target), RAW_XCORR)
    else:
        reference, limit = None, target
    raw = int(sum(c >= RAW_XCORR for c in (*fault_free, *in_fault)))
    over = int(sum(c >= limit for c in in_fault))
    ok = None if not (fault_free or in_fault) else raw == 0 and over == 0
    return {"fault_free_reference": reference, "limit": limit, "fault_windows_over_limit": over,
            "raw_windows": raw, "ok": ok}


def report_median(delays: list) -> float:
    return float(np.median([d for _, d, _ in delays])) if delays else float("nan")


def analyze(soak: SoakRun, x: np.ndarray, y: np.ndarray) -> dict:
    from rtanon.eval.signal import envelope_delay_s, max_xcorr

    dur = x.shape[0] / RATE
    guard = [(f.start_s - 0.5, (f.end_s or f.start_s + f.duration_s) + 3.0) for f in soak.faults]

    def clean(a: float, b: float) -> bool:
        return all(b <= g0 or a >= g1 for g0, g1 in guard)

    delays = []  # (window start, delay ms, clean)
    t = WARMUP_S
    while t + DELAY_WINDOW_S <= dur:
        i, j = int(t * RATE), int((t + DELAY_WINDOW_S) * RATE)
        if np.sqrt(np.mean(np.square(y[i:j]))) > 10 ** (SPEECH_DBFS / 20):
            d = envelope_delay_s(x[i:j], y[i:j], max_delay_s=MAX_DELAY_S)
            delays.append((t, 1000.0 * d, clean(t, t + DELAY_WINDOW_S)))
        t += DELAY_WINDOW_S / 2
    good = [(t, d) for t, d, ok in delays if ok]
    edge = min(300.0, max(DELAY_WINDOW_S, (dur - WARMUP_S) / 5))
    first = [d for t, d in good if t < WARMUP_S + edge]
    last = [d for t, d in good if t + DELAY_WINDOW_S > dur - edge]
    base_delay_ms = float(np.median([d for _, d in good])) if good else float("nan")  # fault-free windows
    steps: dict[str, list[float]] = {}  # fault-free delay in the 45 s after each fault minus the 40 s before it
    for f in soak.faults:
        end = f.end_s or f.start_s + f.duration_s
        before = [d for t, d in good if f.start_s - 40.0 <= t and t + DELAY_WINDOW_S <= f.start_s]
        after = [d for t, d in good if end + 3.0 <= t <= end + 45.0]
        if before and after:
            steps.setdefault(f.name, []).append(float(np.median(after) - np.median(before)))
    drift = float(np.median(last) - np.median(first)) if first and last else float("nan")

    xc = []  # (window start, max xcorr)
    lag = int(MAX_DELAY_S * RATE)
    t = WARMUP_S
    while t + XCORR_WINDOW_S <= dur:
        i, j = int(t * RATE), int((t + XCORR_WINDOW_S) * RATE)
        seg = y[i:j]
        if np.sqrt(np.mean(np.square(seg))) > 10 ** (SPEECH_DBFS / 20) and np.any(x[max(0, i - lag) : j]):
            xc.append((t, max_xcorr(seg, x[max(0, i - lag) : j])))
        t += XCORR_WINDOW_S
    in_fault = [c for t, c in xc if not clean(t, t + XCORR_WINDOW_S)]
    fault_free = [c for t, c in xc if clean(t, t + XCORR_WINDOW_S)]

    xdb, ydb = _frames_db(x), _frames_db(y)
    d_ref = base_delay_ms if np.isfinite(base_delay_ms) else report_median(delays)
    d_s = d_ref / 1000.0 if np.isfinite(d_ref) else 0.3
    baseline = [lag_s for t0 in np.arange(WARMUP_S, dur - 10.0, 7.3) if clean(t0 - 2.0, t0 + 8.0)
                for lag_s in [_onset_lag_s(xdb, ydb, t0, d_s, 5.0)] if lag_s is not None]
    base_lag = float(np.median(baseline)) if baseline else 0.0
    faults = []
    for f in soak.faults:
        end = f.end_s or f.start_s + f.duration_s
        back = None if f.name not in ("input", "output", "stop") else next(
            (r["t_soak"] - end for r in soak.status if r["t_soak"] >= end and r.get("input_up") and r.get("output_up")),
            None)
        # speech while a stream is still reopening is lost: that time counts in full, then the lag from the
        # first clear speech after it to the output's speech
        lag_s = _onset_lag_s(xdb, ydb, end + (back or 0.0), d_s)
        before = [r for r in soak.status if r["t_soak"] <= f.start_s]
        after = [r for r in soak.status if r["t_soak"] <= end + 5.0]
        inc = {k: (after[-1][k] - before[-1][k]) if before and after else None
               for k in ("missed_deadlines", "input_overflows", "output_underflows", "stage_errors",
                         "input_skips", "drift_trims", "output_stuck")}
        win = [c for t, c in xc if t + XCORR_WINDOW_S > f.start_s and t < end + 10.0]
        faults.append({**asdict(f), "recovery_s": None if lag_s is None else (back or 0.0) + max(0.0, lag_s - base_lag),
                       "onset_lag_s": lag_s, "max_xcorr_during_and_after": max(win) if win else None,
                       "devices_up_after_s": back,
                       "counter_increase": inc})

    last_status = soak.status[-1] if soak.status else {}
    rss = soak.rss
    rss_first = [m for t, m in rss if WARMUP_S <= t < WARMUP_S + edge]
    rss_last = [m for t, m in rss if t > dur - edge]
    rss_growth = float(np.median(rss_last) - np.median(rss_first)) if rss_first and rss_last else float("nan")
    recoveries = [f["recovery_s"] for f in faults if f["recovery_s"] is not None]
    max_xc = max((c for _, c in xc), default=float("nan"))
    raw_check = raw_voice_check(fault_free, in_fault, soak.method)
    report = {
        "method": soak.method, "duration_s": dur, "live_exit_code": soak.live_rc,
        "delay_ms": {"median": base_delay_ms, "median_all": report_median(delays), "first_median": float(np.median(first)) if first else None,
                     "last_median": float(np.median(last)) if last else None, "drift": drift,
                     "edge_s": edge, "windows": [(round(t, 1), round(d, 1), ok) for t, d, ok in delays]},
        "status_delay_ms": last_status.get("delay_ms"), "status_delay_measured": last_status.get("delay_measured"),
        "counters": {k: last_status.get(k) for k in ("chunks", "speech_chunks", "missed_deadlines", "input_overflows",
                                                     "output_underflows", "stage_errors", "worker_errors",
                                                     "input_skips", "drift_trims", "input_reopens",
                                                     "output_reopens", "output_stuck")},
        "rss_mb": {"first_median": float(np.median(rss_first)) if rss_first else None,
                   "last_median": float(np.median(rss_last)) if rss_last else None, "growth": rss_growth,
                   "max": max((m for _, m in rss), default=None),
                   "series": [(round(t), round(m, 1)) for t, m in rss[:: max(1, len(rss) // 120)]]},
        "xcorr": {"max": max_xc, "max_fault_free": max(fault_free, default=None),
                  "max_in_faults": max(in_fault, default=None), "windows": len(xc),
                  **{k: v for k, v in raw_check.items() if k != "ok"}},
        "delay_step_after_fault_ms": {k: {"median": float(np.median(v)), "sum": float(np.sum(v)), "faults": len(v)}
                                      for k, v in steps.items()},
        "recorders": soak.recorders,
        "onset_lag_fault_free_s": base_lag, "faults": faults,
        "recovery_max_s": max(recoveries) if recoveries else None,
        "faults_unmeasured": [f["name"] for f in faults if f["recovery_s"] is None],
    }
    report["targets"] = {
        "drift_ms<5": bool(abs(drift) < TARGETS["drift_ms"]) if np.isfinite(drift) else None,
        "rss_growth_mb<5": bool(rss_growth < TARGETS["rss_growth_mb"]) if np.isfinite(rss_growth) else None,
        "recovery_s<1": bool(recoveries) and max(recoveries) < TARGETS["recovery_s"]
        and not report["faults_unmeasured"],
        "no_raw_voice": raw_check["ok"],
    }
    return report


def _f(v, digits: int = 1, sign: bool = False, missing: str = "-") -> str:
    """A figure, or ``missing`` where there is none (None, or NaN: no window to take it from)."""
    if v is None or not np.isfinite(v):
        return missing
    return f"{v:{'+' if sign else ''}.{digits}f}"


def format_report(r: dict) -> str:
    d, c, m, xc = r["delay_ms"], r["counters"], r["rss_mb"], r["xcorr"]
    lines = [
        f"soak: method {r['method']}, {r['duration_s']:.0f} s, live exit code {r['live_exit_code']}",
        f"end-to-end delay: median {_f(d['median'])} ms fault-free, {_f(d['median_all'])} ms in all "
        f"windows; first {d['edge_s']:.0f} s {_f(d['first_median'])} ms, last {d['edge_s']:.0f} s "
        f"{_f(d['last_median'])} ms, drift "
        + (f"{d['drift']:+.1f} ms " if np.isfinite(d["drift"]) else "not measured ")
        + ("" if np.isfinite(d["median"]) and np.isfinite(d["drift"]) else
           "(not enough fault-free windows; a longer --duration gives them) ") +
        f"(status line: {r['status_delay_ms']} ms, {'server-reported' if r['status_delay_measured'] else 'estimated'})",
        f"missed deadlines {c['missed_deadlines']}, xruns {(c['input_overflows'] or 0) + (c['output_underflows'] or 0)}"
        f" (in {c['input_overflows']}, out {c['output_underflows']}), stage errors {c['stage_errors']}, worker errors "
        f"{c['worker_errors']}, reopened input {c['input_reopens']} / output {c['output_reopens']} times "
        f"(output stuck without callbacks {c.get('output_stuck')})",
        f"resident memory: first {_f(m['first_median'])} MB, last {_f(m['last_median'])} MB, growth "
        f"{_f(m['growth'], sign=True, missing='not measured (too short a run)')} MB, max {_f(m['max'])} MB",
        f"max normalised cross-correlation output vs microphone: {_f(xc['max'], 3)} over {xc['windows']} windows "
        f"(fault-free {_f(xc['max_fault_free'], 3)}, during/after faults {_f(xc['max_in_faults'], 3)}); raw-voice "
        f"limit for fault windows {xc['limit']:.3f} ("
        + (f"fault-free p{XCORR_PERCENTILE:g} {xc['fault_free_reference']:.3f} + {XCORR_MARGIN:g}"
           if xc["fault_free_reference"] is not None else "no fault-free window: the method's fixed limit")
        + f", at most {RAW_XCORR:g}): {xc['fault_windows_over_limit']} over it, {xc['raw_windows']} windows at "
        f"{RAW_XCORR:g} or more",
    ]
    if r.get("delay_step_after_fault_ms"):
        lines.append("delay after a fault minus before it, median (sum) ms: " + ", ".join(
            f"{k} {v['median']:+.0f} ({v['sum']:+.0f})" for k, v in r["delay_step_after_fault_ms"].items()))
    for name, runs in (r.get("recorders") or {}).items():
        lines.append(f"{name} recording: {len(runs)} run{'s' if len(runs) != 1 else ''}; stamp drift "
                     f"{_f(max((abs(u['slope_ppm']) for u in runs), default=None))} ppm at most, spread "
                     f"{_f(max((u['spread_ms'] for u in runs), default=None))} ms at most (p99)")
    lines.append(f"recovery after faults (onset lag minus the fault-free {r['onset_lag_fault_free_s'] * 1000:.0f} ms):")
    for f in r["faults"]:
        rec = "not measured (no speech onset)" if f["recovery_s"] is None else f"{f['recovery_s']:.2f} s"
        if f["devices_up_after_s"] is not None:
            rec += f" (both streams up {f['devices_up_after_s']:.2f} s after)"
        xcf = f["max_xcorr_during_and_after"]
        lines.append(f"  {f['name']:<7} at {f['start_s']:7.1f} s for {f['duration_s']:.0f} s: recovery {rec}, "
                     f"max xcorr {'-' if xcf is None else f'{xcf:.3f}'}, counters +{f['counter_increase']}")
    lines.append("targets: " + ", ".join(f"{k} {'ok' if v else ('n/a' if v is None else 'FAIL')}"
                                        for k, v in r["targets"].items()))
    return "\n".join(lines)
