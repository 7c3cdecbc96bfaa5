"""Session._held_upper, the bound of the checkpoints' memory that lets a chained cell skip walking
every held snapshot (issue 20): it must never be below the exact count, whatever happened to the
sandbox in between (rollbacks, %rewind, mode changes, restarts, comm-like snapshots), or the
budget would let the checkpoints grow past it."""
from __future__ import annotations

from typing import Any

import pytest

from zeroboot_kernel.session import Session


@pytest.fixture
def session(template: Any) -> Any:
    s = Session(template)
    yield s
    s.close()


def cell(s: Session, code: str, n: int) -> dict[str, Any]:
    reply = s.execute(code, execution_count=n)
    s.prepare_next_cell()
    return reply


def check(s: Session) -> None:
    assert s._held_upper() >= s.checkpoint_memory()


def test_the_bound_never_undercounts(session: Any) -> None:
    s, n = session, 0
    steps = [
        "x = bytearray(3 << 20)",                 # a few MiB of new pages
        "y = [bytearray(4096) for _ in range(300)]",
        "import ctypes; ctypes.string_at(0)",      # a crash: rollback to the checkpoint, which is released
        "x = bytearray(2 << 20)",
        "%rewind",
        "z = bytearray(1 << 20)",
        "%mode",
        "w = bytearray(1 << 20)",
        "%restart",
        "v = bytearray(5 << 20)",
    ]
    for code in steps:
        n += 1
        if code == "%rewind":
            s.rewind(1)
        elif code == "%mode":
            s.set_mode("isolated")
            cell(s, "q = bytearray(1 << 20)", n)
            s.set_mode("chained")
        elif code == "%restart":
            s.restart()
        else:
            cell(s, code, n)
        check(s)
        cell(s, "pass", n + 100)
        check(s)


def test_the_bound_is_used_in_the_steady_state_and_drops_still_happen(template: Any) -> None:
    """Small cells well within the budget keep a bound (no walk); a budget smaller than the
    checkpoints still drops the oldest, as before."""
    s = Session(template, checkpoint_memory=64 << 20, checkpoint_disk=0)
    try:
        for n in range(1, 4):
            cell(s, "1+1", n)
        assert s._held_bound is not None and s._held_bound[0] is s.sandbox
        for n in range(4, 12):
            cell(s, "big = bytearray(12 << 20); big[::4096] = b'x' * len(big[::4096])", n)
            check(s)
        assert s.budget_dropped > 0
    finally:
        s.close()
