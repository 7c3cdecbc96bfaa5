"""Escape battery, syscalls: every syscall number 0..511 with adversarial arguments
(guest/syscall_walk.c: NULL, -1, edge integers, the low 2 MiB, the kernel half, non-canonical
addresses, huge lengths, the last bytes before unmapped memory, garbage and self-referencing
buffers, overlapping in/out buffers, paths, the UART). The host process must survive every call;
a call that ends its guest (exit, a signal it sent itself, a forged sigreturn frame, a garbage UART
frame) is contained and the walk restarts after it in a fresh sandbox."""
from __future__ import annotations

import re
import time
from collections import Counter

import pytest

import battery
from zeroboot_kernel.errors import SandboxError
from zeroboot_kernel.native import EventKind

CALLS_PER_NR = int(re.search(r"#define CALLS_PER_NR (\d+)", (battery.GUEST_SOURCES / "syscall_walk.c").read_text())[1])
SLICE = 0.02  # a guest blocked this long in a call with no timeout gets a signal (EINTR)

# how a guest may end mid-walk: by its own doing, contained in its sandbox
CONTAINED = {EventKind.EXIT, EventKind.FAULT, EventKind.ERROR}
ERROR_WORDS = ("malformed UART frame",)


def walk(first: int, last: int) -> dict:
    """Walk [first, last]; returns what happened: calls made, guest endings by (nr, index)."""
    nr, index = first, 0
    endings: list[tuple[int, int, str, str]] = []
    boots = signals = inputs = 0
    while True:
        boots += 1
        assert boots < 2000, "the walk does not progress"
        with battery.boot("syscall_walk", str(first), str(last), str(nr), str(index)) as sb:
            at, done, buf = (nr, index - 1), False, b""
            progress_seen = time.monotonic()
            walking = False  # no call is made before the first AT line (the handler comes first)
            end = None
            while end is None:
                ev = sb.run(time.monotonic() + SLICE)
                if ev.kind is EventKind.OUTPUT:
                    buf += ev.data
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line.startswith(b"AT "):
                            _, n, i = line.split()
                            at = (int(n), int(i))
                            progress_seen = time.monotonic()
                            walking = True
                        elif line == b"DONE":
                            done = True
                elif ev.kind is EventKind.INPUT:
                    sb.push_input(b"\x00" * 16)  # the call reads the UART: give it bytes
                    inputs += 1
                elif ev.kind in (EventKind.TIMEOUT, EventKind.KICK):
                    # blocked in a call: interrupt it (a guest still starting on a loaded host is
                    # slow, not blocked, and has no handler yet)
                    if walking and time.monotonic() - progress_seen > SLICE:
                        try:
                            sb.raise_signal(10)
                            signals += 1
                        except SandboxError:
                            end = ev  # no handler (the call replaced it): count as an ending
                        assert signals < 20000
                elif ev.kind is EventKind.FRAME:
                    pass  # a call wrote a well-formed frame to the UART
                else:
                    end = ev
            if done:
                assert end.kind is EventKind.EXIT and end.status == 0, end
                return {"boots": boots, "endings": endings, "signals": signals, "inputs": inputs}
            assert end.kind in CONTAINED or end.kind is EventKind.TIMEOUT, end
            if end.kind is EventKind.ERROR:
                assert any(w in end.message for w in ERROR_WORDS), f"engine error at {at}: {end.message}"
            endings.append((at[0], at[1], end.kind.name, end.message[:100]))
            nr, index = at[0], at[1] + 1
            if index >= CALLS_PER_NR:
                nr, index = nr + 1, 0
            if nr > last:
                return {"boots": boots, "endings": endings, "signals": signals, "inputs": inputs}


@pytest.mark.parametrize("first, last", [(0, 127), (128, 255), (256, 383), (384, 511)])
def test_every_syscall_with_adversarial_arguments(first, last):
    result = walk(first, last)
    endings = result["endings"]
    # which numbers ended their guest, and how: only the calls that can by design
    by_nr = Counter(nr for nr, _, _, _ in endings)
    allowed = {15, 60, 62, 200, 231, 234,  # rt_sigreturn, exit, kill, tkill, exit_group, tgkill
               0, 1, 17, 18, 19, 20, 295, 296}  # reads/writes whose fd is the UART: a garbage frame
    unexpected = {nr: n for nr, n in by_nr.items() if nr not in allowed}
    assert not unexpected, f"calls that ended their guest: {unexpected}: {[e for e in endings if e[0] in unexpected][:10]}"
    battery.engine_still_works()
