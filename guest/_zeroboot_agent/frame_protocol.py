"""The cell channel's frame protocol (docs/PROTOCOL.md): header layout, limits and frame types.

The one source of these numbers for both ends: the agent inside the guest imports it as
`_zeroboot_agent.frame_protocol` (the guest sees only this package and the standard library, so
this module uses nothing else), the kernel as `zeroboot_guest._zeroboot_agent.frame_protocol`
(zeroboot_kernel/frames.py). The engine's C copy of the header constants (ZB_FRAME_* in
native/zeroboot.h) is checked against this module by tests/test_wire_contracts.py.

A frame is, little endian: u32 magic, u16 version, u16 type, u32 payload length, then the payload
(a UTF-8 JSON object). There is no end marker: only the length delimits a frame.
"""
from __future__ import annotations

import enum
import struct

MAGIC = 0x5A42464D                   # bytes "MFBZ" little endian
VERSION = 1
HEADER = struct.Struct("<IHHI")      # magic, version, type, payload length
MAX_PAYLOAD = 16 << 20               # 16 MiB: a longer frame ends the VM with an error


class FrameType(enum.IntEnum):
    # host -> guest (requests)
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


# The channel's self-check (docs/PROTOCOL.md, "Self-check"): every guest frame of a request
# carries its number `seq`; the frames that end a request also carry `stream_chars`, the number
# of characters the request wrote to sys.stdout/sys.stderr.
CHECK_FIELDS = ("seq", "stream_chars")
REPLY_TYPES = (FrameType.DONE, FrameType.COMPLETE_REPLY, FrameType.INSPECT_REPLY)


def pack_header(ftype: int, length: int) -> bytes:
    """The 12 header bytes of a frame of type `ftype` with a payload of `length` bytes."""
    return HEADER.pack(MAGIC, VERSION, ftype, length)


def header_ok(magic: int, version: int, length: int) -> bool:
    """Whether an unpacked header belongs to this protocol (the engine applies the same rule)."""
    return magic == MAGIC and version == VERSION and length <= MAX_PAYLOAD
