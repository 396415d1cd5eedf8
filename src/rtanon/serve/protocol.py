"""The wire format of ``rtanon serve`` (WebSocket, one connection = one session).

Binary messages carry audio, both ways: a little-endian ``uint32`` sequence number, then
``FRAME_SAMPLES`` (320: 20 ms at 16 kHz) mono PCM16 little-endian samples, 644 bytes in all. The
server answers every frame it receives with one frame of the same sequence number: the session's
anonymized output for that 20 ms (comfort noise when the session is muted, silent, or its frame was
late), ``algorithmic latency`` behind the input (the ``ready`` message gives it).

Text messages are JSON objects with a ``type``:

- client -> server, first and once: ``{"type": "start", "method": "neural"|"mcadams",
  "privacy": "balanced"|"strong", "identity": {...}}`` (every field but ``type`` optional; ``identity``
  an identity file's JSON, pinned on purpose; by default a fresh voice from OS randomness);
- client -> server: ``{"type": "mute", "on": true|false}``, ``{"type": "new_voice"}`` (at the next
  pause), ``{"type": "stats"}``, ``{"type": "bye"}``;
- server -> client: ``{"type": "ready", ...}`` (session id, frame size, latency, the voice) and
  ``{"type": "stats", ...}`` (the session's counters and the server's tick figures).

A client that breaks a rule is closed with code 1008 and the reason.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from rtanon.config import METHOD_NAMES, PRIVACY_POINTS
from rtanon.constants import FRAME_SAMPLES, SAMPLE_RATE_HZ

HEADER = struct.Struct("<I")
FRAME_BYTES = HEADER.size + 2 * FRAME_SAMPLES
#: the largest text message (an identity's JSON is about 6 kB)
MAX_TEXT_BYTES = 64 * 1024
CONTROL_TYPES = ("start", "mute", "new_voice", "stats", "bye")


class ProtocolError(ValueError):
    """A client broke the protocol; the message is the reason it is closed with."""


def pack_frame(seq: int, audio: np.ndarray) -> bytes:
    """``seq`` and ``FRAME_SAMPLES`` float32 samples in [-1, 1] -> one binary message."""
    pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype("<i2")
    return HEADER.pack(seq & 0xFFFFFFFF) + pcm.tobytes()


def unpack_frame(data: bytes) -> tuple[int, np.ndarray]:
    """One binary message -> ``(seq, FRAME_SAMPLES float32 samples in [-1, 1))``."""
    if len(data) != FRAME_BYTES:
        raise ProtocolError(f"a frame is {FRAME_BYTES} bytes (uint32 sequence number + {FRAME_SAMPLES} PCM16 "
                            f"samples, 20 ms at {SAMPLE_RATE_HZ} Hz), got {len(data)}")
    (seq,) = HEADER.unpack_from(data)
    pcm = np.frombuffer(data, "<i2", offset=HEADER.size)
    return seq, pcm.astype(np.float32) / 32768.0


def parse_control(text: str) -> dict:
    """A text message -> its checked control object (unknown fields are refused, not ignored)."""
    if len(text) > MAX_TEXT_BYTES:
        raise ProtocolError(f"a control message is at most {MAX_TEXT_BYTES} bytes")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError("a control message is a JSON object") from None
    if not isinstance(message, dict) or message.get("type") not in CONTROL_TYPES:
        raise ProtocolError(f"a control message is a JSON object whose type is one of {', '.join(CONTROL_TYPES)}")
    allowed = {"start": {"method": str, "privacy": str, "identity": dict}, "mute": {"on": bool}}
    fields = allowed.get(message["type"], {})
    for key, value in message.items():
        if key == "type":
            continue
        if key not in fields:
            raise ProtocolError(f"{message['type']}: unknown field {key[:40]!r}")
        if not isinstance(value, fields[key]):
            raise ProtocolError(f"{message['type']}.{key} must be a JSON {_json_name(fields[key])}")
    if message["type"] == "mute" and "on" not in message:
        raise ProtocolError("mute needs on: true or false")
    if message.get("method", METHOD_NAMES[0]) not in METHOD_NAMES:
        raise ProtocolError(f"start.method must be one of {', '.join(METHOD_NAMES)}")
    if message.get("privacy", PRIVACY_POINTS[0]) not in PRIVACY_POINTS:
        raise ProtocolError(f"start.privacy must be one of {', '.join(PRIVACY_POINTS)}")
    return message


def _json_name(kind: type) -> str:
    return {str: "string", bool: "boolean", dict: "object"}[kind]
