"""The guest agent booted inside a real VM (zeroboot_kernel.native.Guest), driven with frames
through the emulated UART: what test_agent_host.py checks on the host, here with the engine serving the
guest's syscalls (reads that block on the UART, signals, clocks, the overlay filesystem).
"""
from __future__ import annotations

import base64
import json
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# the documented frame protocol, deliberately not the agent's own module (see frame_spec.py)
from frame_spec import (COMPLETE, COMPLETE_REPLY, DISPLAY, DONE, ERROR, EXECUTE, HEADER, INPUT_REPLY,
                        INPUT_REQUEST, INSPECT, INSPECT_REPLY, MAGIC, READY, RESULT, STREAM)

from zeroboot_kernel.native import Event, EventKind, Guest
from zeroboot_kernel.guest_view import python_spec

AGENT = Path(__file__).resolve().parent.parent / "guest" / "_zeroboot_agent"

TIMEOUT = 120.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Frame:
    type: int
    payload: dict[str, Any]
    t: float


def encode(ftype: int, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload).encode()
    return HEADER.pack(MAGIC, 1, ftype, len(body)) + body


class GuestAgent:
    """The agent in a sandbox. The guest runs only inside run(), so every wait drives it."""

    def __init__(self, preload: str) -> None:
        self.sb = Guest.boot(python_spec([str(AGENT), "--preload", preload]))
        self.console = bytearray()   # the guest's raw fd 1 / fd 2
        self.waiting = False         # blocked reading the UART (an INPUT event was seen)
        self.next_id = 1
        self.count = 0
        self.ready = self.next_frame()
        assert self.ready.type == READY, self.ready

    def _run(self, timeout: float) -> Event:
        ev = self.sb.run(time.monotonic() + timeout)
        if ev.kind is EventKind.OUTPUT:
            self.console += ev.data
        elif ev.kind in (EventKind.EXIT, EventKind.FAULT, EventKind.ERROR, EventKind.TIMEOUT):
            raise AssertionError(f"guest stopped: {ev}\nconsole:\n{self.console.decode(errors='replace')}")
        return ev

    def next_frame(self, timeout: float = TIMEOUT) -> Frame:
        deadline = time.monotonic() + timeout
        while True:
            assert not self.waiting, "the guest waits for input; no frame will come"
            ev = self._run(max(0.01, deadline - time.monotonic()))
            if ev.kind is EventKind.FRAME:
                payload = json.loads(ev.data)
                for name in ("seq", "stream_chars"):  # the self-check (test_agent_host.py checks it)
                    payload.pop(name, None)
                return Frame(ev.frame_type, payload, time.monotonic())
            if ev.kind is EventKind.INPUT:
                self.waiting = True
                raise AssertionError("the guest blocked reading the UART while a frame was expected")

    def wait_for_read(self, timeout: float = TIMEOUT) -> None:
        """Run until the guest blocks reading the UART (no frames may come out meanwhile)."""
        deadline = time.monotonic() + timeout
        while not self.waiting:
            ev = self._run(max(0.01, deadline - time.monotonic()))
            assert ev.kind is not EventKind.FRAME, f"unexpected frame {ev.frame_type}: {ev.data[:200]!r}"
            if ev.kind is EventKind.INPUT:
                self.waiting = True

    def send(self, ftype: int, payload: dict[str, Any]) -> None:
        self.wait_for_read()
        self.sb.push_input(encode(ftype, payload))
        self.waiting = False

    def start_execute(self, code: str, *, reseed: str | None = None, allow_stdin: bool = True) -> int:
        rid, self.next_id = self.next_id, self.next_id + 1
        self.count += 1
        self.send(EXECUTE, {"id": rid, "code": code, "silent": False, "store_history": True,
                            "user_expressions": {}, "allow_stdin": allow_stdin,
                            "execution_count": self.count, "reseed": reseed})
        return rid

    def until_done(self, rid: int, answer: str | None = None) -> list[Frame]:
        frames: list[Frame] = []
        while True:
            frame = self.next_frame()
            frames.append(frame)
            if frame.type == DONE:
                assert frame.payload["id"] == rid
                return frames
            if frame.type == INPUT_REQUEST:
                assert answer is not None
                self.send(INPUT_REPLY, {"value": answer})

    def execute(self, code: str, answer: str | None = None, **kw: Any) -> list[Frame]:
        return self.until_done(self.start_execute(code, **kw), answer)

    def request(self, ftype: int, reply_type: int, **payload: Any) -> dict[str, Any]:
        rid, self.next_id = self.next_id, self.next_id + 1
        self.send(ftype, {"id": rid, **payload})
        frame = self.next_frame()
        assert frame.type == reply_type and frame.payload["id"] == rid, frame
        return frame.payload


def text_of(frames: list[Frame], name: str = "stdout") -> str:
    return "".join(f.payload["text"] for f in frames if f.type == STREAM and f.payload["name"] == name)


@pytest.fixture(scope="module")
def guest() -> Iterator[GuestAgent]:
    agent = GuestAgent("numpy")
    yield agent
    agent.sb.close()


def test_ready_in_vm(guest: GuestAgent) -> None:
    ready = guest.ready.payload
    assert ready["preloaded"] == ["numpy"]
    assert ready["preload_errors"] == []
    assert ready["language_info"]["name"] == "python"
    # start-up wrote nothing to the console (no chatter, no fatal error)
    assert b"Traceback" not in guest.console


def test_print_result_error_in_vm(guest: GuestAgent) -> None:
    frames = guest.execute("print(1+1)")
    assert [(f.type, f.payload.get("text")) for f in frames] == [(STREAM, "2\n"), (DONE, None)]
    assert frames[-1].payload["status"] == "ok"

    frames = guest.execute("1+1")
    assert [f.type for f in frames] == [RESULT, DONE]
    assert frames[0].payload["data"] == {"text/plain": "2"}
    assert frames[0].payload["execution_count"] == guest.count

    frames = guest.execute("1/0")
    assert [f.type for f in frames] == [ERROR, DONE]
    assert frames[0].payload["ename"] == "ZeroDivisionError"
    tb = ANSI.sub("", "\n".join(frames[0].payload["traceback"]))
    assert "1/0" in tb and "agent" not in tb
    assert frames[-1].payload["status"] == "error"


def test_numpy_and_display_in_vm(guest: GuestAgent) -> None:
    frames = guest.execute("import numpy as np\nnp.arange(10).sum()")
    assert frames[0].type == RESULT and frames[0].payload["data"]["text/plain"] == "np.int64(45)"
    frames = guest.execute("class H:\n    def _repr_html_(self): return '<b>x</b>'\ndisplay(H())")
    assert frames[0].type == DISPLAY and frames[0].payload["data"]["text/html"] == "<b>x</b>"
    frames = guest.execute("class P:\n    def _repr_png_(self): return b'\\x89PNG fake'\nP()")
    assert base64.b64decode(frames[0].payload["data"]["image/png"]) == b"\x89PNG fake"


def test_streaming_in_vm(guest: GuestAgent) -> None:
    frames = guest.execute("import time\nfor i in range(5):\n    print(i)\n    time.sleep(0.2)")
    streams = [f for f in frames if f.type == STREAM]
    assert text_of(frames) == "0\n1\n2\n3\n4\n"
    assert len(streams) >= 4
    assert frames[-1].t - streams[0].t >= 0.6


def test_big_output_in_vm(guest: GuestAgent) -> None:
    frames = guest.execute("for i in range(10000):\n    print(f'{i:07d}' + 'x' * 92)")
    text = text_of(frames)
    assert text == "".join(f"{i:07d}" + "x" * 92 + "\n" for i in range(10000))
    assert sum(f.type == STREAM for f in frames) < 1000


def test_input_in_vm(guest: GuestAgent) -> None:
    frames = guest.execute("name = input('who? ')\nprint('hi', name)", answer="Ada")
    requests = [f.payload for f in frames if f.type == INPUT_REQUEST]
    assert requests == [{"prompt": "who? ", "password": False}]
    assert text_of(frames) == "hi Ada\n"


def test_complete_and_inspect_in_vm(guest: GuestAgent) -> None:
    reply = guest.request(COMPLETE, COMPLETE_REPLY, code="pri", cursor_pos=3)
    assert "print" in reply["matches"] and reply["cursor_start"] == 0
    reply = guest.request(INSPECT, INSPECT_REPLY, code="print", cursor_pos=2, detail_level=0)
    assert reply["found"] is True and "Docstring" in ANSI.sub("", reply["data"]["text/plain"])
    frames = guest.execute("print?")
    assert frames[-1].payload["payload"][0]["source"] == "page"


def test_reseed_in_vm(guest: GuestAgent) -> None:
    code = "import random, numpy\nprint(random.random(), numpy.random.rand())"
    a = text_of(guest.execute(code, reseed="11" * 16))
    b = text_of(guest.execute(code, reseed="22" * 16))
    c = text_of(guest.execute(code, reseed="11" * 16))
    assert a != b and a == c


def test_interrupt_in_vm(guest: GuestAgent) -> None:
    rid = guest.start_execute("print('started', flush=True)\nwhile True:\n    pass")
    first = guest.next_frame()
    assert first.type == STREAM and first.payload["text"] == "started\n"
    guest.sb.raise_signal(signal.SIGINT)
    frames = guest.until_done(rid)
    assert [f.payload["ename"] for f in frames if f.type == ERROR] == ["KeyboardInterrupt"]
    assert frames[-1].payload["status"] == "error"
    assert text_of(guest.execute("print('after')")) == "after\n"


def test_exit_keeps_agent_in_vm(guest: GuestAgent) -> None:
    frames = guest.execute("import sys\nsys.exit(2)")
    assert frames[-1].payload["ename"] == "SystemExit"
    assert text_of(guest.execute("print('alive')")) == "alive\n"


def test_interrupt_sleep_in_vm(guest: GuestAgent) -> None:
    rid = guest.start_execute("import time\nprint('started', flush=True)\ntime.sleep(60)")
    first = guest.next_frame()
    assert first.type == STREAM
    guest.sb.raise_signal(signal.SIGINT)
    frames = guest.until_done(rid)
    assert frames[-1].payload["ename"] == "KeyboardInterrupt"
    assert frames[-1].t - first.t < 30


def test_interrupt_input_in_vm(guest: GuestAgent) -> None:
    rid = guest.start_execute("input('never answered: ')")
    request = guest.next_frame()
    assert request.type == INPUT_REQUEST
    guest.wait_for_read()  # the agent now blocks reading the UART for the reply
    guest.sb.raise_signal(signal.SIGINT)
    guest.waiting = False
    frames = guest.until_done(rid)
    assert frames[-1].payload["ename"] == "KeyboardInterrupt"
    guest.send(INPUT_REPLY, {"value": "late"})  # ignored by the idle agent
    assert text_of(guest.execute("print('after')")) == "after\n"
