"""The cell channel checks itself (issue 22): a reply whose output did not all arrive, or frames
lost, duplicated or out of order, are an error of that cell, and the session is repaired by the
rollback to the cell's checkpoint. And the interrupt state machine at the session level: one
SIGINT per cell however many interrupts, a rollback at most once, nothing left for the next cell.
"""
from __future__ import annotations

import threading
import time

import pytest

from zeroboot_kernel.session import Session
from zeroboot_kernel.template import Template

# A frame as the agent writes it (docs/PROTOCOL.md): user code can write one to the UART itself.
FORGE = ("import json, os, struct\n"
         "def forge(ftype, payload):\n"
         "    body = json.dumps(payload).encode()\n"
         "    fd = os.open('/dev/ttyS0', os.O_WRONLY)\n"
         "    os.write(fd, struct.pack('<IHHI', 0x5A42464D, 1, ftype, len(body)) + body)\n"
         "    os.close(fd)\n")


@pytest.fixture
def session(template: Template):
    # The interrupt grace period is wall time: on a loaded host the guest's handling of the
    # KeyboardInterrupt can outlast the 2 s default, and these tests are about the channel, not it.
    s = Session(template, interrupt_grace=60)
    yield s
    s.close()


def run(s: Session, code: str, n: int) -> tuple[dict, str]:
    out: list[str] = []
    reply = s.execute(code, execution_count=n, on_stream=lambda name, text: out.append(text))
    s.prepare_next_cell()
    return reply, "".join(out)


def test_output_the_agent_lost_is_an_error_and_the_cell_is_rolled_back(session: Session) -> None:
    run(session, "state = 'before'", 1)
    # the text is counted when written, then dropped from the agent's buffer before it is sent
    reply, out = run(session, "import sys\nstate = 'during'\nprint('lost', end='')\n"
                              "sys.stdout._channel._pending.clear()", 2)
    assert reply["status"] == "error" and reply["ename"] == "ChannelError", reply
    assert "4 characters of output but 0 arrived" in reply["evalue"] and "rolled back" in reply["evalue"]
    assert session.rollbacks == 1
    reply, out = run(session, "print(state)", 3)
    assert reply["status"] == "ok" and out == "before\n"


@pytest.mark.parametrize("code, says", [
    # numbered wrong: the host expected frame #0
    ("forge(101, {'name': 'stdout', 'text': 'forged\\n', 'seq': 7})", "numbered 7"),
    # numbered right, so the agent's own first frame is #0 a second time
    ("forge(101, {'name': 'stdout', 'text': 'x', 'seq': 0})\nprint('mine')", "numbered 0"),
    # the reply of a request that is not running
    ("forge(107, {'id': 12345, 'status': 'ok', 'seq': 0, 'stream_chars': 0})", "another request"),
], ids=["misnumbered", "duplicated", "foreign-reply"])
def test_a_forged_frame_is_an_error_of_the_cell(session: Session, code: str, says: str) -> None:
    run(session, FORGE + "state = 'before'", 1)
    reply, _ = run(session, "state = 'during'\n" + code, 2)
    assert reply["status"] == "error" and reply["ename"] == "ChannelError", reply
    assert says in reply["evalue"] and "rolled back" in reply["evalue"], reply["evalue"]
    assert session.rollbacks == 1
    reply, out = run(session, "print(state)", 3)
    assert reply["status"] == "ok" and out == "before\n"


def test_many_interrupts_raise_one_keyboardinterrupt(session: Session) -> None:
    """The cell catches KeyboardInterrupt and goes on: the second and later interrupts of the same
    cell raise nothing more (one SIGINT per cell); the grace period then rolls it back, once."""
    run(session, "state = 'before'", 1)
    code = ("import time\nstate = 'during'\ncaught = 0\nend = time.monotonic() + 8\n"
            "while time.monotonic() < end:\n    try:\n        time.sleep(0.01)\n"
            "    except KeyboardInterrupt:\n        caught += 1\n        print('caught', caught)\n")
    session.interrupt_grace = 1.0

    def fire() -> None:
        time.sleep(0.3)
        for _ in range(10):
            session.sandbox.interrupt()
            time.sleep(0.02)

    threading.Thread(target=fire).start()
    reply, out = run(session, code, 2)
    assert out == "caught 1\n", out
    assert reply["status"] == "error" and reply["ename"] == "SandboxTimeout" and "rolled back" in reply["evalue"]
    assert session.rollbacks == 1 and session.sandbox.interrupts_signalled == 1
    reply, out = run(session, "print(state)", 3)
    assert reply["status"] == "ok" and out == "before\n"
    assert session.rollbacks == 1


def test_an_interrupt_after_the_cell_does_not_reach_the_next(session: Session) -> None:
    run(session, "x = 1", 1)
    session.sandbox.interrupt()  # between cells: the cell it was for has ended
    reply, out = run(session, "print('next')", 2)
    assert reply["status"] == "ok" and out == "next\n"
    assert session.sandbox.interrupts_signalled == 0


def test_an_interrupt_during_input_stops_it_without_a_value(session: Session) -> None:
    """As the engine server does when an interrupt ends the wait for the frontend: no answer is
    sent (None), the guest's read fails with EINTR and input() raises KeyboardInterrupt; the cell
    never goes on with a value nobody typed."""
    asked: list[str] = []

    def on_input(prompt: str, password: bool) -> str | None:
        asked.append(prompt)
        session.sandbox.interrupt()  # the user interrupts instead of answering
        return None

    out: list[str] = []
    reply = session.execute("a = input('first? ')\nprint('got', repr(a))", execution_count=1,
                            on_input=on_input, on_stream=lambda name, text: out.append(text))
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert asked == ["first? "] and out == []
    reply, text = run(session, "print('fine')", 2)
    assert text == "fine\n"


def test_a_cell_that_catches_the_interrupt_is_asked_again(session: Session) -> None:
    answers = iter([None, "second"])
    asked: list[str] = []

    def on_input(prompt: str, password: bool) -> str | None:
        asked.append(prompt)
        value = next(answers)
        if value is None:
            session.sandbox.interrupt()
        return value

    out: list[str] = []
    code = "try:\n    a = input('one? ')\nexcept KeyboardInterrupt:\n    a = input('two? ')\nprint(a)"
    reply = session.execute(code, execution_count=1, on_input=on_input, on_stream=lambda n, t: out.append(t))
    assert reply["status"] == "ok", reply
    assert asked == ["one? ", "two? "] and "".join(out) == "second\n"


def test_frame_numbers_do_not_reach_the_reply(session: Session) -> None:
    reply, _ = run(session, "1", 1)
    assert "seq" not in reply and "stream_chars" not in reply
    assert "seq" not in session.complete("pri", 3)

