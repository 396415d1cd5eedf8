"""Issue 27: `rtanon soak`, short. `rtanon live` runs for 60 s through a private PulseAudio daemon with real
speech as the microphone while every fault is injected once (CPU overload, a stage exception storm, the
microphone's and the output's modules unloaded and reloaded, SIGSTOP/SIGCONT for 1 s).

60 s is the shortest schedule that holds every fault once (15 s start-up, 10 s CPU overload, a 3 s gap
after each fault, 10 s fault-free tail); McAdams keeps it light on a 2-core CI machine. The neural
method's hour-long run is the issue's report (/work/notes/issue27.md), not a CI job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.pulse
missing = [t for t in ("pulseaudio", "pactl", "pacat") if shutil.which(t) is None]
if missing:
    pytest.skip(f"needs {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils libasound2-plugins)",
                allow_module_level=True)


def test_a_short_soak_survives_every_fault_without_raw_voice(speech_paths, tmp_path):
    from rtanon.live.soak import FAULTS, TARGETS

    report_path = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "rtanon", "soak", "--method", "mcadams", "--duration", "60",
                           "--seed", "3", "--speech", *map(str, speech_paths), "--report", str(report_path)],
                          capture_output=True, text=True, timeout=300)
    if "does not list the ALSA 'pulse' device" in proc.stderr or "No input device matching 'pulse'" in proc.stderr:
        pytest.skip("PortAudio does not list the ALSA 'pulse' device: install libasound2-plugins")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report_path.read_text())
    assert sorted(f["name"] for f in r["faults"]) == sorted(FAULTS), r["faults"]
    assert r["live_exit_code"] == 0
    c = r["counters"]
    assert c["stage_errors"] > 0 and c["input_reopens"] >= 1 and c["output_reopens"] >= 1, c
    # every fault recovered, within what the watcher allows (a stream reopened during the overload may never
    # flow and wait out a fresh stream's 2.5 s); the 1 s target, TARGETS["recovery_s"], is the soak's report
    assert not r["faults_unmeasured"] and r["recovery_max_s"] < 3.0, r["faults"]
    # no raw voice, during and after every fault: McAdams' own level is near 0.4 at most
    assert r["xcorr"]["windows"] >= 5 and r["xcorr"]["max"] < TARGETS["max_xcorr"]["mcadams"], r["xcorr"]
    assert r["targets"]["no_raw_voice"] is True and r["xcorr"]["raw_windows"] == 0, r["xcorr"]
    assert r["rss_mb"]["growth"] < TARGETS["rss_growth_mb"], r["rss_mb"]
    assert 0 < r["delay_ms"]["median_all"] < 1000, r["delay_ms"]
    assert r["status_delay_measured"] is True  # PulseAudio reports its delay through PortAudio


def test_a_report_without_fault_free_windows_prints_no_nan():
    """`soak --duration 60` had no fault-free windows at both ends: the report printed `median nan ms` and
    `drift +nan ms`; it says that the figure is missing and why."""
    from rtanon.live.soak import format_report

    nan = float("nan")
    report = {
        "method": "mcadams", "duration_s": 60.0, "live_exit_code": 0,
        "delay_ms": {"median": nan, "median_all": 80.0, "first_median": None, "last_median": None, "drift": nan,
                     "edge_s": 60.0},
        "status_delay_ms": 75, "status_delay_measured": True,
        "counters": dict.fromkeys(("missed_deadlines", "input_overflows", "output_underflows", "stage_errors",
                                   "worker_errors", "input_reopens", "output_reopens", "output_stuck"), 0),
        "rss_mb": {"first_median": None, "last_median": None, "growth": nan, "max": 300.0},
        "xcorr": {"max": nan, "max_fault_free": None, "max_in_faults": None, "windows": 0, "limit": 0.5,
                  "fault_free_reference": None, "fault_windows_over_limit": 0, "raw_windows": 0},
        "delay_step_after_fault_ms": {}, "recorders": {}, "onset_lag_fault_free_s": 0.0, "faults": [],
        "targets": {"drift_ms<5": None},
    }
    text = format_report(report)
    assert "nan" not in text.lower(), text
    assert "not enough fault-free windows" in text and "median - ms fault-free" in text, text
