"""``rtanon virtual-device create|remove|status``: the "rtanon" microphone."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "virtual-device", help="create/remove the virtual microphone 'rtanon' (Linux: PulseAudio/PipeWire)",
        description="On Linux, loads a null sink (rtanon_sink) that `rtanon live --output rtanon` plays into, "
                    "and a remap source over its monitor, listed by apps as the microphone 'rtanon'. Works with "
                    "PulseAudio and PipeWire-pulse; nothing persists across a reboot. On macOS install "
                    "BlackHole, on Windows VB-CABLE, and pass that device to `rtanon live --output` (see README).")
    p.add_argument("action", choices=("create", "remove", "status"))
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from rtanon.live import pulse
    from rtanon.commands._common import invoked_as
    from rtanon.errors import CliError

    if not sys.platform.startswith("linux"):
        raise CliError("virtual-device manages PulseAudio/PipeWire on Linux; on macOS install BlackHole, "
                       "on Windows VB-CABLE, then use it as `rtanon live --output <that device>`")
    try:
        if args.action == "create":
            st = pulse.create()
            print(f"virtual microphone '{pulse.SOURCE_DESCRIPTION}' ({pulse.SOURCE_NAME}) ready; "
                  f"now run: {invoked_as()} live --input <mic> --output rtanon")
            return 0 if st.ready else 1
        if args.action == "remove":
            print(f"removed {pulse.remove()} module(s)")
            return 0
        st = pulse.status()
        print(f"sink {pulse.SINK_NAME}: {'present' if st.sink else 'absent'}; "
              f"microphone {pulse.SOURCE_NAME}: {'present' if st.source else 'absent'}")
        return 0 if st.ready else 1
    except pulse.PulseError as exc:
        raise CliError(str(exc)) from None
