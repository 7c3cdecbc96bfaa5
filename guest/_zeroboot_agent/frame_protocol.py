"""The cell channel's frame protocol (docs/PROTOCOL.md): header layout, limits and frame types.

The one source of these numbers for both ends: the agent inside the guest imports it as
`_zeroboot_agent.frame_protocol` (the guest sees only this package and the standard library, so
this module uses nothing else), the kernel as `zeroboot_guest._zeroboot_agent.frame_protocol`
(zeroboot_kernel/frames.py). The engine's C copy of the header constants (ZB_FRAME_* in
native/zeroboot.h) is checked against this module by tests/test_wire_contracts.py.

A frame is, little endian: u32 magic, u16 version, u16 type, u32 payload length, then the payload
(a UTF-8 JSON object). There is no end marker: only the length delimits a frame. The comm frames
(BINARY_TYPES) carry binary buffers next to their JSON: their payload is `u32 json length, the
JSON, u32 buffer count, then per buffer u32 length and its bytes` (pack_binary / unpack_binary),
so widget buffers (images, arrays) cross the channel as raw bytes, not base64.
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
    COMM = 7             # a frontend comm_open / comm_msg / comm_close for the guest (binary payload)
    COMM_INFO = 8        # the guest's comm registry (comm_info_request; resynchronisation after a restore)
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
    COMM_MESSAGE = 111   # a comm_open / comm_msg / comm_close from the guest for the frontend (binary payload)
    COMM_DONE = 112      # the end of a COMM request
    COMM_INFO_REPLY = 113


# The channel's self-check (docs/PROTOCOL.md, "Self-check"): every guest frame of a request
# carries its number `seq`; the frames that end a request also carry `stream_chars`, the number
# of characters the request wrote to sys.stdout/sys.stderr. A frame sent between requests (a
# thread's or an asyncio task's output or widget update while the agent waits: "Output between
# requests") carries `idle`, its number among those sent since the last reply, instead of `seq`;
# only IDLE_TYPES may be sent then.
CHECK_FIELDS = ("seq", "stream_chars", "idle")
REPLY_TYPES = (FrameType.DONE, FrameType.COMPLETE_REPLY, FrameType.INSPECT_REPLY, FrameType.COMM_DONE,
               FrameType.COMM_INFO_REPLY)
IDLE_TYPES = (FrameType.STREAM, FrameType.COMM_MESSAGE)

# Frames whose payload is JSON plus binary buffers (pack_binary); every other payload is JSON only.
BINARY_TYPES = (FrameType.COMM, FrameType.COMM_MESSAGE)
MAX_BUFFERS = 64                     # binary buffers in one comm frame
BUFFER_LENGTH = struct.Struct("<I")  # the JSON's length, the buffer count, each buffer's length


def pack_header(ftype: int, length: int) -> bytes:
    """The 12 header bytes of a frame of type `ftype` with a payload of `length` bytes."""
    return HEADER.pack(MAGIC, VERSION, ftype, length)


def header_ok(magic: int, version: int, length: int) -> bool:
    """Whether an unpacked header belongs to this protocol (the engine applies the same rule)."""
    return magic == MAGIC and version == VERSION and length <= MAX_PAYLOAD


def pack_binary(body: bytes, buffers: list[bytes]) -> bytes:
    """The payload of a BINARY_TYPES frame: the JSON `body`, then the buffers as raw bytes."""
    if len(buffers) > MAX_BUFFERS:
        raise ValueError(f"a comm message carries at most {MAX_BUFFERS} buffers, not {len(buffers)}")
    parts = [BUFFER_LENGTH.pack(len(body)), body, BUFFER_LENGTH.pack(len(buffers))]
    for buf in buffers:
        parts += [BUFFER_LENGTH.pack(len(buf)), buf]
    return b"".join(parts)


def unpack_binary(payload: bytes) -> tuple[bytes, list[bytes]]:
    """The JSON and the buffers of a BINARY_TYPES payload. ValueError unless the lengths add up
    to exactly the payload and there are at most MAX_BUFFERS buffers."""
    view = memoryview(payload)
    size = BUFFER_LENGTH.size

    def length_at(offset: int, what: str) -> int:
        if offset + size > len(view):
            raise ValueError(f"comm frame cut short before its {what}")
        return int(BUFFER_LENGTH.unpack_from(view, offset)[0])

    json_len = length_at(0, "JSON length")
    offset = size + json_len
    if offset > len(view):
        raise ValueError(f"comm frame's JSON length {json_len} is past the end of the frame")
    body = bytes(view[size:offset])
    count = length_at(offset, "buffer count")
    offset += size
    if count > MAX_BUFFERS:
        raise ValueError(f"comm frame holds {count} buffers, more than {MAX_BUFFERS}")
    buffers = []
    for i in range(count):
        n = length_at(offset, f"buffer {i}'s length")
        offset += size
        if offset + n > len(view):
            raise ValueError(f"comm frame's buffer {i} of {n} bytes is past the end of the frame")
        buffers.append(bytes(view[offset:offset + n]))
        offset += n
    if offset != len(view):
        raise ValueError(f"comm frame has {len(view) - offset} bytes after its last buffer")
    return body, buffers
