"""Checkpoints written into the store pages of the checkpoints dropped just before them (issue 23):
zb_snapshot_keep_spare in the engine, Session._checkpoint_now in the kernel. What is checked is
that such a checkpoint holds exactly the guest's state (restore, fork, crash rollback, %rewind),
that freed memory still reads as zeros, and that no spare page outlives the snapshot it was kept
for (the budget counts every page the checkpoints hold)."""
from __future__ import annotations

import os

import pytest

from zeroboot_kernel.native import (dead_waiting_bytes, give_back_dead_store_pages, keep_spare_pages, spare_bytes,
                                   spare_reused_bytes)
from zeroboot_kernel.bench.common import checkpoint_store_kb
from zeroboot_kernel.sandbox import Sandbox
from zeroboot_kernel.session import Session
from session_helpers import snapshot_stores

MIB = 1 << 20
N = 8 * MIB // 8 * 8   # float64 elements of a 64 MiB array


def out(sb, code: str) -> str:
    r = sb.execute(code)
    assert r.status == "ok", r.stderr
    return r.stdout.strip()


def test_a_snapshot_written_into_spare_pages_restores_and_forks_exactly(template) -> None:
    with template.fork() as sb:
        out(sb, f"import numpy as np\na = np.full({N}, 1.0)")
        first = sb.snapshot()
        out(sb, f"a = np.full({N}, 2.0); b = np.arange({N // 2}, dtype=np.float64)")
        before = spare_reused_bytes()
        keep_spare_pages(True)
        try:
            first.release()          # the sandbox still has it as its base until the next snapshot
            second = sb.snapshot()   # ... which lets it go: its 64 MiB array is written into those pages
        finally:
            keep_spare_pages(False)
        assert spare_bytes() == 0    # what the snapshot did not use was given back
        assert spare_reused_bytes() - before >= 60 * MIB
        check = "print(a.min(), a.max(), b[0], b[-1], int(b.sum() == np.arange(len(b), dtype=np.float64).sum()))"
        expected = f"2.0 2.0 0.0 {float(N // 2 - 1)} 1"
        assert out(sb, check) == expected
        out(sb, "a[:] = -1.0; b[:] = -1.0")
        sb.restore(second)
        assert out(sb, check) == expected
        with sb.fork() as child:
            assert out(child, check) == expected
        with Sandbox(second.fork(), template, False) as other:   # a fork of the snapshot itself
            assert out(other, check) == expected
        # memory freed and handed out again still reads as zeros
        assert out(sb, f"del a, b\nc = np.empty({N})\nprint(int(c.any()))") == "0"
        second.release()


def cell(s: Session, code: str, n: int) -> dict:
    text: list[str] = []
    reply = s.execute(code, execution_count=n, on_stream=lambda name, t: text.append(t) if name == "stdout" else None)
    s.prepare_next_cell()
    assert spare_bytes() == 0    # no spare page is held between cells
    reply["stdout"] = "".join(text)
    return reply


def test_checkpoints_within_a_full_budget_reuse_pages_and_roll_back_exactly(template) -> None:
    s = Session(template, checkpoint_memory=200 * MIB, checkpoint_disk=0)
    try:
        cell(s, "import numpy as np", 1)
        before = spare_reused_bytes()
        for n in range(2, 8):
            assert cell(s, f"a = np.full({N}, {n}.0); b = a * 2", n)["status"] == "ok"
        assert s.budget_dropped > 0
        assert spare_reused_bytes() - before >= 100 * MIB   # later checkpoints refilled dropped ones
        assert s.checkpoint_memory() <= 200 * MIB or s.describe_budget()["over_budget"]
        # a crash after big-array cells rolls back to exactly the last checkpoint
        reply = cell(s, "a[:] = -1\nb[:] = -1\nimport ctypes\nctypes.string_at(0)", 8)
        assert reply["status"] == "error" and reply["ename"] == "SandboxCrashed"
        assert cell(s, "print(a.min(), a.max(), b.min(), b.max())", 9)["stdout"].strip() == "7.0 7.0 14.0 14.0"
        # %rewind as deep as kept gives each cell's own arrays back
        depth = len(s.checkpoints)
        if depth:
            s.rewind(1)
            assert cell(s, "print(a.min(), a.max(), b.max())", 10)["stdout"].strip() == "7.0 7.0 14.0"
    finally:
        s.close()


@pytest.mark.parametrize("budget_mib", [1, 4096])
def test_budgets_that_drop_everything_or_nothing_keep_rollback(template, budget_mib: int) -> None:
    s = Session(template, checkpoint_memory=budget_mib * MIB, checkpoint_disk=0)
    try:
        cell(s, "import numpy as np", 1)
        for n in range(2, 5):
            cell(s, f"a = np.full({N // 4}, {n}.0)", n)
        reply = cell(s, "a[:] = 0\nimport ctypes\nctypes.string_at(0)", 5)
        assert reply["ename"] == "SandboxCrashed"
        assert cell(s, "print(a.min(), a.max())", 6)["stdout"].strip() == "4.0 4.0"
    finally:
        s.close()


SMALL_CELLS = ["1+1", "x = [i * i for i in range(1000)]", "print('x' * 100)", "hist.append(len(hist))",
               "d = {i: str(i) for i in range(500)}"]


def test_checkpoints_past_keep_are_refilled_and_rewind_stays_exact(template) -> None:
    """The checkpoint that falls past `keep` is released just before the next one is taken, which
    writes its pages into the pages it gave back; every checkpoint kept still restores exactly."""
    s = Session(template, keep=4, checkpoint_disk=0)
    try:
        cell(s, "hist = []", 1)
        before = spare_reused_bytes()
        for n in range(2, 40):
            assert cell(s, SMALL_CELLS[n % len(SMALL_CELLS)], n)["status"] == "ok"
        assert spare_reused_bytes() - before >= 100 * 4096   # most cells refilled the retired one's pages
        assert cell(s, "print(len(hist), hist == list(range(len(hist))))", 40)["stdout"].strip() == "8 True"
        reply = cell(s, "hist.clear()\nimport ctypes\nctypes.string_at(0)", 41)   # crash: rolled back
        assert reply["ename"] == "SandboxCrashed"
        assert cell(s, "print(len(hist))", 42)["stdout"].strip() == "8"
        # %rewind to a recent checkpoint, then to the oldest kept: the entries the cells before it appended
        def appended_before(number: int) -> str:
            return str(sum(1 for k in range(2, min(number, 40)) if SMALL_CELLS[k % 5].startswith("hist")))
        for depth in (2, len(s.checkpoints) - 1):
            target = s.checkpoints[-depth].number
            s.rewind(depth)
            assert cell(s, "print(len(hist))", 100 + depth)["stdout"].strip() == appended_before(target), target
        assert target < 39
    finally:
        s.close()


def test_refilled_stores_do_not_pile_up(template) -> None:
    """Refilling a store keeps it alive: stores that are mostly dead or small stop being refilled
    once old, and snapshots copy their last pages out, so that the number of stores stays flat
    over a long session instead of growing by one every few cells."""
    s = Session(template, keep=5, checkpoint_disk=0)
    try:
        cell(s, "hist = []", 1)
        counts = []
        for n in range(2, 302):
            cell(s, SMALL_CELLS[n % len(SMALL_CELLS)], n)
            if n % 100 == 1:
                counts.append(snapshot_stores())
        # measured over these 200 cells: +11 stores (the session's own growth: pages its cells
        # keep), +42 when every store is refilled whatever its age and state
        assert counts[-1] - counts[0] <= 24, counts
    finally:
        s.close()


def test_dead_store_pages_are_given_back_in_bounded_batches(template) -> None:
    """Pages no snapshot uses any more wait to be punched out together, but never more than the
    batch bound (8 MiB): a replaced half of a big array in a store that stays alive is given back
    at once; the small runs of small cells wait, and none after zb_snapshot_give_back_dead (the
    idle release). What waits is only dead pages: every snapshot kept still restores exactly."""
    half = 2 * MIB  # float64 elements of 16 MiB
    with template.fork() as sb:
        out(sb, f"import numpy as np\na = np.zeros({2 * half})")
        base = sb.snapshot()
        out(sb, "a[:] = 1.0")
        both = sb.snapshot()           # its store: both halves
        out(sb, f"a[:{half}] = 2.0")
        first_half = sb.snapshot()     # shares the second half with `both`
        held = checkpoint_store_kb(os.getpid())
        both.release()                 # the first half of its store dies, the second lives on
        assert dead_waiting_bytes() <= 8 * MIB
        assert held - checkpoint_store_kb(os.getpid()) >= 15 * MIB // 1024  # KiB
        out(sb, "a[:] = -1.0")
        sb.restore(first_half)
        assert out(sb, f"print(a[:{half}].min(), a[{half}:].max())") == "2.0 1.0"
        base.release()
        first_half.release()
    s = Session(template, keep=3, checkpoint_disk=0)
    try:
        cell(s, "hist = []", 1)
        seen = []
        for n in range(2, 60):
            assert cell(s, SMALL_CELLS[n % len(SMALL_CELLS)], n)["status"] == "ok"
            seen.append(dead_waiting_bytes())
        assert 0 < max(seen) <= 8 * MIB, seen
        give_back_dead_store_pages()
        assert dead_waiting_bytes() == 0
        expected = str(sum(1 for k in range(2, 60) if SMALL_CELLS[k % 5].startswith("hist")))
        assert cell(s, "print(len(hist))", 60)["stdout"].strip() == expected
        target = s.checkpoints[0].number
        s.rewind(len(s.checkpoints))
        before_target = str(sum(1 for k in range(2, target) if SMALL_CELLS[k % 5].startswith("hist")))
        assert cell(s, "print(len(hist))", 61)["stdout"].strip() == before_target
    finally:
        s.close()
