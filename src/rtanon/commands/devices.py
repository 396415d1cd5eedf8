"""``rtanon devices``: list audio devices."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "devices", help="list audio input/output devices",
        description="Lists PortAudio devices with their index. `rtanon live --input/--output` accept the "
                    "index, a substring of the name (as python-sounddevice matches it), `pulse:NAME` for a "
                    "PulseAudio/PipeWire source or sink, or `rtanon` for the virtual microphone.")
    p.set_defaults(func=run)


def run(args) -> int:
    from rtanon.commands._common import import_sounddevice

    devices = import_sounddevice().query_devices()
    if not len(devices):
        print("no audio devices found: PortAudio sees none. On Linux start PulseAudio or PipeWire (and install "
              "libasound2-plugins for the ALSA 'pulse' device), or check that ALSA lists your card (aplay -l).")
        return 1
    print(devices)
    return 0
