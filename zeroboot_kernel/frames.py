"""Frames of the cell channel between the host and the guest agent (docs/PROTOCOL.md).

The engine (native/uart16550.c) validates and reassembles frames coming from the guest; this
module builds the frames the host sends, and decodes payloads.
"""
from __future__ import annotations

import enum
import json
import struct
from typing import Any

from . import schema

MAGIC = 0x5A42464D
VERSION = 1
HEADER = struct.Struct("<IHHI")
MAX_PAYLOAD = 16 * 1024 * 1024


class FrameType(enum.IntEnum):
    # host -> guest
    EXECUTE = 1
    INPUT_REPLY = 2
    COMPLETE = 3
    INSPECT = 4
    RUN = 5
    SESSION = 6
    # guest -> host
    READY = 100
    STREAM = 101
    DISPLAY = 102
    RESULT = 103
    ERROR = 104
    CLEAR_OUTPUT = 105
    INPUT_REQUEST = 106
    DONE = 107
    COMPLETE_REPLY = 108
    INSPECT_REPLY = 109
    SESSION_REPLY = 110


def encode(ftype: FrameType, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    if len(body) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(body)} bytes exceeds {MAX_PAYLOAD}")
    return HEADER.pack(MAGIC, VERSION, int(ftype), len(body)) + body


def decode_payload(data: bytes) -> dict[str, Any]:
    """The JSON object of a frame payload, at most schema.MAX_DEPTH deep; a malformed one is
    reported (ValueError), not trusted."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (deep nesting: RecursionError)
        raise ValueError(f"guest sent a frame that is not JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise ValueError("guest sent a frame whose payload is not a JSON object")
    schema.check_depth(obj, "guest frame")
    return obj


# The shape of each guest frame's payload (docs/PROTOCOL.md), checked before the host uses it.
# Fields every agent frame (seq) or reply (stream_chars) carries for the channel's self-check:
# frame numbers and the count of characters the cell printed (docs/PROTOCOL.md, "Self-check").
CHECK_FIELDS = ("seq", "stream_chars")

CHECKS = {
    FrameType.STREAM: schema.stream, FrameType.DISPLAY: schema.display, FrameType.RESULT: schema.result,
    FrameType.ERROR: schema.error, FrameType.CLEAR_OUTPUT: schema.clear_output,
    FrameType.INPUT_REQUEST: schema.input_request, FrameType.DONE: schema.done,
    FrameType.COMPLETE_REPLY: schema.complete_reply, FrameType.INSPECT_REPLY: schema.inspect_reply,
    FrameType.SESSION_REPLY: schema.session_reply,
}


def decode(ftype: int, data: bytes) -> dict[str, Any]:
    """A guest frame's payload, decoded and checked against its type's shape (only the fields of
    that shape are kept). ValueError (schema.SchemaError) for anything else."""
    check = CHECKS.get(ftype)  # type: ignore[call-overload]
    if check is None:
        raise ValueError(f"guest sent a frame of unknown type {ftype}")
    try:
        payload = decode_payload(data)
        checked = check(payload)
        for name in CHECK_FIELDS:  # the channel's self-check numbers (sandbox._CellRun compares them)
            if name in payload:
                checked[name] = schema.check_int(payload, name)
        return checked
    except schema.SchemaError as exc:
        name = FrameType(ftype).name
        raise ValueError(f"guest sent a malformed {name} frame: {exc}") from None
