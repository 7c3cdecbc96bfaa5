"""The cell channel's frames as docs/PROTOCOL.md writes them, for the agent tests (test_agent_host.py,
test_agent_vm.py). Written out here on purpose instead of imported from
guest/_zeroboot_agent/frame_protocol.py: those tests check the agent against the documented
protocol, not against itself (test_wire_contracts.py checks the module against the document)."""
from __future__ import annotations

import struct

MAGIC = 0x5A42464D                    # "MFBZ"
VERSION = 1
HEADER = struct.Struct("<IHHI")       # magic, version, type, payload length
EXECUTE, INPUT_REPLY, COMPLETE, INSPECT = 1, 2, 3, 4
READY, STREAM, DISPLAY, RESULT, ERROR, CLEAR_OUTPUT, INPUT_REQUEST, DONE, COMPLETE_REPLY, INSPECT_REPLY = range(100, 110)
COMM, COMM_INFO = 7, 8
COMM_MESSAGE, COMM_DONE, COMM_INFO_REPLY = 111, 112, 113
# Comm frames carry binary buffers: u32 JSON length, the JSON, u32 buffer count, then per buffer
# u32 length and its bytes (at most 64 buffers).
BINARY = (COMM, COMM_MESSAGE)
MAX_BUFFERS = 64
U32 = struct.Struct("<I")


def pack_comm(body: bytes, buffers: list[bytes]) -> bytes:
    out = U32.pack(len(body)) + body + U32.pack(len(buffers))
    for buf in buffers:
        out += U32.pack(len(buf)) + buf
    return out


def unpack_comm(payload: bytes) -> tuple[bytes, list[bytes]]:
    (n,) = U32.unpack_from(payload, 0)
    body, pos = payload[4:4 + n], 4 + n
    (count,) = U32.unpack_from(payload, pos)
    pos += 4
    assert count <= MAX_BUFFERS
    buffers = []
    for _ in range(count):
        (size,) = U32.unpack_from(payload, pos)
        buffers.append(payload[pos + 4:pos + 4 + size])
        pos += 4 + size
    assert pos == len(payload), "bytes after the last buffer"
    return body, buffers
