"""``run_live``: the live loop on sound devices. It opens the PortAudio streams (python-sounddevice) around
a ``LiveCore``, watches them, prints a one-line status (and, for ``rtanon soak``, one JSON object per
status interval), and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack

from rtanon.config import SAMPLE_RATE_HZ
from rtanon.engine import Session
from rtanon.live.config import LiveConfig
from rtanon.live.core import LiveCore
from rtanon.live.delay import DelayMeter
from rtanon.live.devices import DeviceError, pick_rate, resolve_device
from rtanon.live.feedback import refuse_feedback
from rtanon.live.pulse_stream import PulseStreamError
from rtanon.live.recent import RecentValues
from rtanon.live.server import server_latency
from rtanon.live.stream import WATCH_INTERVAL_S, DeviceStream, pulse_presence, watch_streams
from rtanon.methods import voice_sentence


def _since_last_status(marks: dict, fields: dict[str, tuple[RecentValues, float]]) -> dict:
    """Each field's percentile over the values recorded since the last status (``marks``: where each
    series stood then; updated); None where none came."""
    out = {}
    for key, (values, q) in fields.items():
        value = values.percentile(q, since=marks.get(key, 0))
        out[key] = None if value is None else round(value, 2)
    for key, (values, _) in fields.items():
        marks[key] = values.count
    return out


def run_live(session: Session, input_spec: str | None, output_spec: str | None, *,
             config: LiveConfig | None = None, duration_s: float | None = None,
             device_rate_hz: int | None = None, status_interval_s: float = 0.5, stream=sys.stderr,
             json_status=None, name: str = "rtanon live", extra_status=None, stop_when=None) -> LiveCore:
    """Runs the live loop until Ctrl-C or ``duration_s``; returns the core with its counters
    (``core.interrupted``: Ctrl-C ended it). ``json_status``: a text stream that gets one JSON object per
    status interval (for ``rtanon soak``); ``name`` starts the running line; ``extra_status()``: a string
    the status line ends with (``rtanon connect``: the server's state); ``stop_when()``: true ends the loop
    (``rtanon connect``: the session failed)."""
    import json

    import sounddevice as sd

    config = config or LiveConfig()
    in_dev, in_env = resolve_device(input_spec, "input")
    out_dev, out_env = resolve_device(output_spec, "output")
    refuse_feedback(in_dev, in_env, out_dev, out_env)
    os.environ.update(in_env)
    os.environ.update(out_env)  # read by the ALSA pulse plugin when the stream opens
    in_rate = pick_rate(in_dev, "input", device_rate_hz)
    out_rate = pick_rate(out_dev, "output", device_rate_hz)
    core = LiveCore(session, in_rate, out_rate, config)
    counters = session.counters
    delay = DelayMeter()

    def in_cb(indata, frames, time_info, status):
        if status.input_overflow:
            counters.input_overflows += 1
        delay.on_input(time_info)
        core.on_input(indata[:, 0])

    def out_cb(outdata, frames, time_info, status):
        if status.output_underflow:
            counters.output_underflows += 1
        delay.on_output(time_info)
        core.on_output(outdata[:, 0])

    inp = DeviceStream("input", in_dev, in_env, in_rate, in_rate * config.block_ms // 1000, in_cb)
    out = DeviceStream("output", out_dev, out_env, out_rate, out_rate * config.out_block_ms // 1000, out_cb,
                       config.out_latency_ms)
    algo_ms = 1000.0 * session.algorithmic_latency_samples / SAMPLE_RATE_HZ
    core.start()
    asked = ExitStack()
    asked.enter_context(server_latency(config.server_latency_ms))  # for every (re)opening of the streams
    try:
        for device in (out, inp):
            try:
                device.open()
            except (sd.PortAudioError, PulseStreamError) as exc:
                raise DeviceError(f"cannot open the {device.kind} device {device.device!r}: {exc}; "
                                  "`rtanon devices` lists the devices") from None
        t_start = time.monotonic()  # the duration counts from the open streams, not the (slow) opening
        t_end = None if duration_s is None else t_start + duration_s
        print(f"{name}: running, {in_rate} Hz in, {out_rate} Hz out, device latency "
              f"{1000 * inp.latency_s:.0f}+{1000 * out.latency_s:.0f} ms, voice: "
              f"{voice_sentence(session.voice)}; Ctrl-C stops", file=sys.stderr, flush=True)
        next_status, marks = 0.0, {}
        while t_end is None or time.monotonic() < t_end:
            time.sleep(WATCH_INTERVAL_S if t_end is None else min(WATCH_INTERVAL_S,
                                                                  max(0.0, t_end - time.monotonic())))
            if stop_when is not None and stop_when():
                break
            watch_streams([inp, out], pulse_presence([inp, out]), out, core.last_output_at)  # device watchdog
            if time.monotonic() < next_status:
                continue
            next_status = time.monotonic() + status_interval_s
            device_ms = delay.device_ms()
            measured = device_ms is not None
            if not measured:
                device_ms = 1000.0 * (inp.latency_s + out.latency_s)
            latency = algo_ms + core.pipeline_ms() + device_ms
            if stream is not None:
                down = "".join(f" | {s.kind} DOWN" for s in (inp, out) if not s.up)
                overload = core.overload_note()
                down += f" | {overload}" if overload else ""
                stream.write(f"\rin {core.level_dbfs:6.1f} dBFS | delay {'' if measured else '~'}{latency:5.1f} ms "
                             f"({'reported by the audio server' if measured else 'estimated'}; algorithmic "
                             f"{algo_ms:.0f}) | missed {counters.missed_deadlines} | "
                             f"xruns {counters.input_overflows + counters.output_underflows} | "
                             f"errors {counters.stage_errors + core.worker_errors}{down}"
                             f"{extra_status() if extra_status is not None else ''}   ")
                stream.flush()
            if json_status is not None:
                json_status.write(json.dumps({
                    "t": time.monotonic() - t_start, "level_dbfs": round(core.level_dbfs, 1),
                    "out_block_ms": config.out_block_ms,
                    "delay_ms": round(latency, 1), "delay_measured": measured, "algorithmic_ms": algo_ms,
                    **_since_last_status(marks, {"compute_p50_ms": (core.compute_ms, 50),
                                                 "compute_p99_ms": (core.compute_ms, 99),
                                                 "queue_wait_ms": (core.queue_waits, 50),
                                                 "device_in_ms": (delay.in_ms, 50),
                                                 "device_out_ms": (delay.out_ms, 50)}),
                    "device_nominal_ms": [round(1000.0 * inp.latency_s, 1), round(1000.0 * out.latency_s, 1)],
                    "chunks": counters.chunks, "speech_chunks": counters.speech_chunks,
                    "missed_deadlines": counters.missed_deadlines, "input_overflows": counters.input_overflows,
                    "output_underflows": counters.output_underflows, "stage_errors": counters.stage_errors,
                    "worker_errors": core.worker_errors, "input_skips": core.input_skips,
                    "drift_trims": core.drift_trims, "overload_drops": core.overload_drops,
                    "overload": core.overload_note(), "input_up": inp.up, "output_up": out.up,
                    "input_reopens": inp.reopens, "output_reopens": out.reopens,
                    "output_stuck": out.stuck,
                    "output_gap_ms": round(1000.0 * delay.take_out_gap(), 1)}) + "\n")
                json_status.flush()
    except KeyboardInterrupt:
        core.interrupted = True
    finally:
        inp.close()
        out.close()
        core.stop()
        asked.close()
        if stream is not None:
            stream.write("\n")
    return core
