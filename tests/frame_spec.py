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
