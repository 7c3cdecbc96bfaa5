"""Each contract between two sides has one source; these tests hold the copies that remain (C
constants, tables in the docs, handler tables) to it, without a VM.

- the frame protocol: guest/_zeroboot_agent/frame_protocol.py; native/zeroboot.h's ZB_FRAME_* and
  docs/PROTOCOL.md's frame type tables must agree with it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from zeroboot_guest._zeroboot_agent import frame_protocol as fp
from zeroboot_kernel import frames

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
