"""``rtanon devices``: list audio devices: PortAudio's, and the PulseAudio/PipeWire sources and sinks."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "devices", help="list audio input/output devices",
        description="Lists PortAudio devices with their index, and the PulseAudio/PipeWire sources and sinks "
                    "with the `pulse:NAME` to pass; marks the defaults and the rtanon virtual microphone. "
                    "`rtanon live --input/--output` accept the index, a substring of the name (as "
                    "python-sounddevice matches it), `pulse:NAME` for a PulseAudio/PipeWire source or sink, or "
                    "`rtanon` for the virtual microphone.")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (for scripts)")
    p.set_defaults(func=run)


def _portaudio(sd) -> list[dict]:
    defaults = {}
    for kind in ("input", "output"):
        try:
            defaults[kind] = sd.query_devices(kind=kind)["index"]
        except (sd.PortAudioError, ValueError, KeyError):
            defaults[kind] = None
    return [{"index": i, "name": d["name"], "inputs": d["max_input_channels"], "outputs": d["max_output_channels"],
             "default_input": i == defaults["input"], "default_output": i == defaults["output"]}
            for i, d in enumerate(sd.query_devices())]


def _pulse() -> dict:
    """The sound server's sources and sinks as ``rtanon.live.pulse`` lists them for the control page, or the
    reason it cannot."""
    from rtanon.live import pulse

    try:
        out = {"error": None}
        for kind, ours in (("sources", pulse.SOURCE_NAME), ("sinks", pulse.SINK_NAME)):
            default = pulse.default_device(kind[:-1])
            out[kind] = [{"name": name, "description": desc, "pass": f"pulse:{name}", "default": name == default,
                          "rtanon": name == ours} for name, desc in pulse.list_devices(kind)]
        return out
    except pulse.PulseError as exc:
        return {"error": str(exc), "sources": [], "sinks": []}


def run(args) -> int:
    import json

    from rtanon.commands._common import import_sounddevice
    from rtanon.errors import CliError
    from rtanon.live.devices import NO_DEVICES_HINT

    portaudio = _portaudio(import_sounddevice())
    server = _pulse()
    virtual = any(s["rtanon"] for s in server["sources"]) and any(s["rtanon"] for s in server["sinks"])
    if args.json:
        print(json.dumps({"portaudio": portaudio, "pulse": server, "virtual_mic": virtual}))
    else:
        print("PortAudio devices (--input/--output INDEX or a part of the NAME):" + ("" if portaudio else " none"))
        for d in portaudio:
            marks = [m for m, on in (("default input", d["default_input"]), ("default output", d["default_output"]))
                     if on]
            print(f"  {d['index']:>3}  {d['name']}  ({d['inputs']} in, {d['outputs']} out)"
                  + (f"  [{', '.join(marks)}]" if marks else ""))
        if server["error"]:
            print(f"PulseAudio/PipeWire: not reachable: {server['error']}")
        for kind, option, ours in (("sources", "--input", "the rtanon virtual microphone, for your apps"),
                                   ("sinks", "--output", "the virtual microphone's sink: --output rtanon")):
            if server["error"]:
                break
            print(f"PulseAudio/PipeWire {kind} ({option} pulse:NAME):")
            width = max((len(r["pass"]) for r in server[kind]), default=0)
            for r in server[kind]:
                marks = [m for m, on in (("default", r["default"]), (ours, r["rtanon"])) if on]
                print(f"  {r['pass']:<{width}}  {r['description']}" + (f"  [{'; '.join(marks)}]" if marks else ""))
        if not server["error"] and not virtual:
            print("the rtanon virtual microphone: not created yet (`rtanon virtual-device create`)")
    if not portaudio:
        raise CliError(NO_DEVICES_HINT)
    return 0
