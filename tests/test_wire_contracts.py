"""Each contract between two sides has one source; these tests hold the copies that remain (C
constants, tables in the docs, handler tables) to it, without a VM.

- the frame protocol: guest/_zeroboot_agent/frame_protocol.py; native/zeroboot.h's ZB_FRAME_* and
  docs/PROTOCOL.md's frame type tables must agree with it;
- the kernel <-> engine requests: zeroboot_kernel/engine_requests.py; the engine's handlers and
  docs/PROTOCOL.md's request table must agree with it;
- the %sandbox subcommands: magics.SANDBOX_PARSERS; the kernel has one handler for each.
"""
from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from zeroboot_guest._zeroboot_agent import frame_protocol as fp
from zeroboot_kernel import engine_requests, frames
from zeroboot_kernel import magics as mg
from zeroboot_kernel.engine_server import EngineServer

pytestmark = pytest.mark.without_kvm

REPO = Path(__file__).resolve().parent.parent


def c_defines(header: Path) -> dict[str, int]:
    """The integer #defines of a C header."""
    text = header.read_text()
    return {name: int(value, 0) for name, value in
            re.findall(r"^#define\s+(\w+)\s+(0x[0-9a-fA-F]+|\d+)\b", text, re.MULTILINE)}


def test_the_engines_frame_constants_are_the_protocols() -> None:
    c = c_defines(REPO / "native" / "zeroboot.h")
    assert c["ZB_FRAME_MAGIC"] == fp.MAGIC
    assert c["ZB_FRAME_VERSION"] == fp.VERSION
    assert c["ZB_FRAME_HEADER"] == fp.HEADER.size == 12
    assert c["ZB_FRAME_MAX_PAYLOAD"] == fp.MAX_PAYLOAD


def test_the_kernel_uses_the_agents_frame_protocol() -> None:
    assert frames.FrameType is fp.FrameType and frames.HEADER is fp.HEADER
    assert frames.encode(fp.FrameType.EXECUTE, {})[:fp.HEADER.size] == fp.pack_header(fp.FrameType.EXECUTE, 2)


def test_the_documented_frame_types_are_the_protocols() -> None:
    doc = (REPO / "docs" / "PROTOCOL.md").read_text()
    documented = {name: int(number) for number, name in re.findall(r"^\| (\d+) \| ([A-Z_]+) \|", doc, re.MULTILINE)}
    assert documented == {t.name: int(t) for t in fp.FrameType}
    assert f"magic `{fp.MAGIC:#x}`" in doc and f"version, currently {fp.VERSION}" in doc


def test_the_engine_serves_exactly_the_table_of_requests() -> None:
    a, b = socket.socketpair()
    with a, b:
        server = EngineServer(b, session=None)  # type: ignore[arg-type]
        assert set(server.handlers) == {op for op, r in engine_requests.REQUESTS.items() if not r.control}


def test_the_documented_requests_are_the_table() -> None:
    doc = (REPO / "docs" / "PROTOCOL.md").read_text()
    m = re.search(r"<!-- engine-requests: begin \(generated\) -->\n(.*?)<!-- engine-requests: end -->", doc, re.DOTALL)
    assert m, "docs/PROTOCOL.md lost its generated table of engine requests"
    assert m.group(1) == engine_requests.markdown_table(), \
        "docs/PROTOCOL.md's request table is out of date: paste `python -m zeroboot_kernel.engine_requests` there"


def test_the_client_sends_only_requests_of_the_table() -> None:
    engine_requests.check_request("export_chunk", {"path": "x", "parts": [], "offset": 0, "size": 1})
    engine_requests.check_request("checkpoint_budget", {})
    with pytest.raises(ValueError, match="not an engine request"):
        engine_requests.check_request("no_such_request", {})
    with pytest.raises(ValueError, match=r"unknown fields \['bogus'\]"):
        engine_requests.check_request("stats", {"bogus": 1})
    with pytest.raises(ValueError, match=r"missing fields \['cursor_pos'\]"):
        engine_requests.check_request("complete", {"code": ""})


def test_every_sandbox_subcommand_has_a_kernel_handler() -> None:
    from zeroboot_kernel.kernel import ZerobootKernel

    assert set(ZerobootKernel.SANDBOX_MAGICS) == set(mg.SUBCOMMANDS)
    for sub in mg.SUBCOMMANDS:
        assert f"%sandbox {sub}" in mg.HELP, f"%sandbox help does not explain {sub}"


def test_the_comm_frames_binary_layout_is_the_documented_one() -> None:
    import frame_spec

    assert fp.BINARY_TYPES == (fp.FrameType.COMM, fp.FrameType.COMM_MESSAGE)
    assert (frame_spec.COMM, frame_spec.COMM_INFO, frame_spec.COMM_MESSAGE, frame_spec.COMM_DONE,
            frame_spec.COMM_INFO_REPLY) == (fp.FrameType.COMM, fp.FrameType.COMM_INFO, fp.FrameType.COMM_MESSAGE,
                                            fp.FrameType.COMM_DONE, fp.FrameType.COMM_INFO_REPLY)
    assert frame_spec.MAX_BUFFERS == fp.MAX_BUFFERS
    buffers = [b"", b"\x00" * 7, bytes(range(256))]
    packed = fp.pack_binary(b'{"a":1}', buffers)
    assert packed == frame_spec.pack_comm(b'{"a":1}', buffers)
    assert fp.unpack_binary(packed) == frame_spec.unpack_comm(packed) == (b'{"a":1}', buffers)


@pytest.mark.parametrize("payload, why", [
    (b"", "cut short"),
    (b"\xff\xff\xff\x7f{}", "past the end"),
    (b"\x02\x00\x00\x00{}", "cut short"),
    (b"\x02\x00\x00\x00{}\x41\x00\x00\x00", "more than 64"),
    (b"\x02\x00\x00\x00{}\x01\x00\x00\x00\x10\x00\x00\x00ab", "past the end"),
    (b"\x02\x00\x00\x00{}\x00\x00\x00\x00junk", "after its last buffer"),
])
def test_a_malformed_comm_payload_is_refused(payload: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        fp.unpack_binary(payload)
    with pytest.raises(ValueError, match="malformed COMM_MESSAGE"):
        frames.decode(fp.FrameType.COMM_MESSAGE, payload)
