"""Devices for the live loop: ``resolve_device`` turns ``--input``/``--output`` into a PortAudio device
and the PulseAudio environment it needs, ``pick_rate`` its sample rate; ``DeviceError`` says why not."""

from __future__ import annotations

from rtanon.config import SAMPLE_RATE_HZ, ConfigError

PULSE_PREFIX = "pulse:"


NO_DEVICES_HINT = ("PortAudio sees no audio device: on Linux start PulseAudio or PipeWire (and install "
                   "libasound2-plugins for the ALSA 'pulse' device), or check that ALSA lists your card (aplay -l)")


class DeviceError(ConfigError):
    """An audio device that cannot be used as asked; the message says what to do."""


def resolve_device(spec: str | None, kind: str) -> tuple[int | str | None, dict[str, str]]:
    """Turns a ``--input``/``--output`` value into a PortAudio device and the
    environment it needs; a DeviceError says why it cannot.

    ``None`` is the default device; digits are an index; ``pulse:NAME`` is the
    PulseAudio sink/source NAME reached through the ALSA ``pulse`` device;
    ``rtanon`` (output) is the rtanon virtual microphone's sink when no
    PortAudio device carries that name; anything else is a name substring, as
    python-sounddevice matches it.
    """
    import sounddevice as sd

    from rtanon.live import pulse

    env_var = "PULSE_SOURCE" if kind == "input" else "PULSE_SINK"
    option = f"--{kind}"
    devices = sd.query_devices()
    if not len(devices):
        raise DeviceError(NO_DEVICES_HINT)
    channels = "max_input_channels" if kind == "input" else "max_output_channels"
    if spec is None:
        try:
            sd.query_devices(None, kind)
        except (sd.PortAudioError, ValueError):
            raise DeviceError(f"no default {kind} device; pick one with {option} (`rtanon devices` lists "
                              "them)") from None
        return None, {}
    if spec.isdigit():
        index = int(spec)
        if index >= len(devices):
            raise DeviceError(f"{option} {spec}: no such device; `rtanon devices` lists {len(devices)} "
                              f"(0 to {len(devices) - 1})")
        if devices[index][channels] < 1:
            raise DeviceError(f"{option} {spec}: {devices[index]['name']!r} has no {kind} channels; "
                              "`rtanon devices` shows which devices do")
        return index, {}
    if spec.startswith(PULSE_PREFIX):
        name = spec[len(PULSE_PREFIX):]
        if not any(d["name"] == "pulse" for d in devices):
            raise DeviceError(f"{option} {spec} needs the ALSA 'pulse' device, which PortAudio does not list: "
                              "start PulseAudio or PipeWire and install libasound2-plugins")
        names = pulse_names("sources" if kind == "input" else "sinks")
        if not name or (names is not None and name not in names):
            known = ", ".join(sorted(names or [])) or "none"
            raise DeviceError(f"{option} {spec}: no PulseAudio {'source' if kind == 'input' else 'sink'} "
                              f"named {name!r} (there are: {known})")
        return "pulse", {env_var: name}
    try:
        sd.query_devices(spec, kind)
        return spec, {}
    except ValueError as exc:
        if spec == "rtanon":
            ours = pulse.SINK_NAME if kind == "output" else pulse.SOURCE_NAME
            names = pulse_names("sinks" if kind == "output" else "sources")
            if names is not None and ours not in names:
                raise DeviceError(f"{option} rtanon: the rtanon virtual microphone does not exist yet; run "
                                  "`rtanon virtual-device create` first") from None
            return "pulse", {env_var: ours}
        raise DeviceError(f"{option} {spec}: {exc}; `rtanon devices` lists the devices") from None


def device_name(device, kind: str) -> str | None:
    """PortAudio's name for a resolved device (None: it has none here)."""
    import sounddevice as sd

    try:
        return sd.query_devices(device, kind)["name"]
    except (sd.PortAudioError, ValueError):
        return None


def pick_rate(device, kind: str, requested: int | None) -> int:
    """``requested`` if given (an error if the device refuses it); else 16 kHz
    when the device takes it (no resampling in rtanon), else its default rate."""
    import sounddevice as sd

    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    rate = requested or SAMPLE_RATE_HZ
    try:
        check(device=device, channels=1, samplerate=rate, dtype="float32")
        return rate
    except Exception as exc:
        if requested:
            raise ConfigError(f"{kind} device {device!r} does not accept {rate} Hz mono float32: {exc}") from None
        return int(sd.query_devices(device, kind)["default_samplerate"])


def pulse_names(kind: str) -> set[str] | None:
    """Names of the PulseAudio ``sources``/``sinks`` now, or None when pactl cannot tell."""
    import shutil
    import subprocess

    if shutil.which("pactl") is None:
        return None
    try:
        proc = subprocess.run(["pactl", "list", "short", kind], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {line.split("\t")[1] for line in proc.stdout.splitlines() if "\t" in line}
