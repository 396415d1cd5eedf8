"""The feedback guard: ``refuse_feedback`` refuses an input that records the output (the output sink's
monitor, or the rtanon virtual microphone while the output is its sink)."""

from __future__ import annotations

import os

from rtanon.live.devices import DeviceError, device_name


def pulse_endpoint(device, env: dict[str, str | None], kind: str) -> str | None:
    """The PulseAudio source (input) or sink (output) a resolved device reaches, or None when it is no
    PulseAudio device or the server does not say: ``PULSE_SOURCE``/``PULSE_SINK`` as the stream will see
    it, else the server's default, for the ALSA ``pulse`` and ``default`` devices."""
    from rtanon.live import pulse

    var = "PULSE_SOURCE" if kind == "input" else "PULSE_SINK"
    if device_name(device, kind) not in ("pulse", "default"):
        return None
    chosen = env[var] if var in env else os.environ.get(var)
    if chosen:
        return chosen
    try:
        return pulse.default_device("source" if kind == "input" else "sink")
    except pulse.PulseError:
        return None


def refuse_feedback(in_dev, in_env: dict[str, str | None], out_dev, out_env: dict[str, str | None]) -> None:
    """Raises DeviceError when the input records the output: the output sink's monitor, or the rtanon
    virtual microphone while the output is its sink (a user who picked the virtual microphone as the
    microphone; the pass-through guard would then find the voice played a moment ago in the input and
    play comfort noise)."""
    from rtanon.live import pulse

    sink = pulse_endpoint(out_dev, out_env, "output")
    if sink is None:
        return
    source = pulse_endpoint(in_dev, in_env, "input")
    if source == f"{sink}.monitor" or (sink == pulse.SINK_NAME and source == pulse.SOURCE_NAME):
        raise DeviceError(f"the input is PulseAudio's {source!r}, which records the output {sink!r}: rtanon "
                          "would anonymize its own voice in a loop; pick your microphone with --input "
                          "pulse:NAME (`rtanon devices` lists the sources)")
