"""Frames of the cell channel between the host and the guest agent (docs/PROTOCOL.md).

The engine (native/uart16550.c) validates and reassembles frames coming from the guest; this
module builds the frames the host sends, and decodes and checks the payloads of guest frames.
The protocol's numbers (header, limits, frame types) come from the one module the agent uses too,
guest/_zeroboot_agent/frame_protocol.py.
"""
from __future__ import annotations

import json
from typing import Any

# The frame protocol itself (header, limits, types) is shared with the agent in the guest.
from zeroboot_guest._zeroboot_agent.frame_protocol import (BINARY_TYPES, CHECK_FIELDS, HEADER, IDLE_TYPES, MAGIC,
                                                           MAX_BUFFERS, MAX_PAYLOAD, REPLY_TYPES, VERSION, FrameType,
                                                           pack_binary, pack_header, unpack_binary)

from . import latency_trace
from . import schema

__all__ = ["BINARY_TYPES", "CHECK_FIELDS", "CHECKS", "HEADER", "IDLE_TYPES", "MAGIC", "MAX_BUFFERS", "MAX_PAYLOAD",
           "REPLY_TYPES", "VERSION", "FrameType", "decode", "decode_payload", "encode"]


def encode(ftype: FrameType, payload: dict[str, Any], buffers: list[bytes] | None = None) -> bytes:
    """A host -> guest frame; `buffers` (raw bytes) only for BINARY_TYPES."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    if ftype in BINARY_TYPES:
        body = pack_binary(body, list(buffers or []))
    elif buffers:
        raise ValueError(f"frames of type {ftype.name} carry no buffers")
    if len(body) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(body)} bytes exceeds {MAX_PAYLOAD}")
    return pack_header(int(ftype), len(body)) + body


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
CHECKS = {
    FrameType.STREAM: schema.stream, FrameType.DISPLAY: schema.display, FrameType.RESULT: schema.result,
    FrameType.ERROR: schema.error, FrameType.CLEAR_OUTPUT: schema.clear_output,
    FrameType.INPUT_REQUEST: schema.input_request, FrameType.DONE: schema.done,
    FrameType.COMPLETE_REPLY: schema.complete_reply, FrameType.INSPECT_REPLY: schema.inspect_reply,
    FrameType.SESSION_REPLY: schema.session_reply, FrameType.COMM_MESSAGE: schema.comm_message,
    FrameType.COMM_DONE: schema.comm_done, FrameType.COMM_INFO_REPLY: schema.comm_info_reply,
}


def decode(ftype: int, data: bytes) -> dict[str, Any]:
    """A guest frame's payload, decoded and checked against its type's shape (only the fields of
    that shape are kept). ValueError (schema.SchemaError) for anything else. The buffers of a
    BINARY_TYPES frame are in its payload's "buffers" (a list of bytes)."""
    check = CHECKS.get(ftype)  # type: ignore[call-overload]
    if check is None:
        raise ValueError(f"guest sent a frame of unknown type {ftype}")
    buffers: list[bytes] = []
    if ftype in BINARY_TYPES:
        try:
            data, buffers = unpack_binary(data)
        except ValueError as exc:
            raise ValueError(f"guest sent a malformed {FrameType(ftype).name} frame: {exc}") from None
    try:
        payload = decode_payload(data)
        checked = check(payload)
        if ftype in BINARY_TYPES:
            checked["buffers"] = buffers
        for name in CHECK_FIELDS:  # the channel's self-check numbers (sandbox._CellRun compares them)
            if name in payload:
                checked[name] = schema.check_int(payload, name)
        if ftype == FrameType.DONE and "trace" in payload:  # latency stamps (only asked for with tracing on)
            checked["trace"] = latency_trace.guest_stamps(payload["trace"])
        return checked
    except schema.SchemaError as exc:
        name = FrameType(ftype).name
        raise ValueError(f"guest sent a malformed {name} frame: {exc}") from None
