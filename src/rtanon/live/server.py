"""The audio server's buffering for the streams this process opens: ``server_latency(ms)`` asks PulseAudio
(and PipeWire through pipewire-pulse) for ``ms`` of buffering and lowers pipewire-pulse's floors."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

#: pipewire-pulse's floors under what a client's streams may ask (its defaults: 256/48000, 5.3 ms, which
#: turn a 5 ms output buffer into 16 ms), lowered for rtanon's own streams as the client properties its
#: ``pulse.rules`` set per application; PulseAudio ignores them
PIPEWIRE_PULSE_FLOORS = {"pulse.min.req": "48/48000", "pulse.min.frag": "48/48000", "pulse.min.quantum": "48/48000"}


@contextmanager
def server_latency(ms: int) -> Iterator[None]:
    """While open, the PulseAudio streams this process opens through PortAudio (PipeWire's too, through
    pipewire-pulse, which turns it into the stream's ``node.latency``) ask the server for ``ms`` of
    buffering: libpulse reads ``PULSE_LATENCY_MSEC`` when a stream connects; and every libpulse client
    it opens carries ``PIPEWIRE_PULSE_FLOORS`` (``PULSE_PROP_<key>``). A value the user's environment
    sets is kept; 0 asks for nothing."""
    if not ms:
        yield
        return
    added = {var: value for var, value in [("PULSE_LATENCY_MSEC", str(ms))] +
             [(f"PULSE_PROP_{key}", value) for key, value in PIPEWIRE_PULSE_FLOORS.items()]
             if var not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for var in added:
            os.environ.pop(var, None)
