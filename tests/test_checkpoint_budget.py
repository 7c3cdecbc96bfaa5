"""The checkpoints' memory budget (issue 23): the oldest checkpoints are dropped first, the one a
crash rolls back to is always kept, the user is told, and rollback after a crash still works.
Cells are run as the engine server runs them (execute, then prepare_next_cell)."""
from __future__ import annotations

import pytest

from zeroboot_kernel import checkpoint_budget as budget
from zeroboot_kernel import magics as mg
from zeroboot_kernel.errors import SandboxError
from zeroboot_kernel.kernel_config import KernelConfigError, KernelSettings
from zeroboot_kernel.session import Session

from session_helpers import run

pytestmark = pytest.mark.without_kvm  # the parsers; the tests of sessions use `template` or say `kvm`

MIB = 1 << 20
# 48 MiB of new, non-zero data per cell in its own mmap (above glibc's largest mmap threshold, so
# replacing `a` unmaps the previous cell's array)
CELL = "a = np.full(48 * 1024 * 1024 // 8, {n}.0)"


# ---- sizes, defaults and the magic (no VM) ----

def test_sizes_parse_with_binary_units() -> None:
    assert budget.parse_size("512M") == 512 * MIB
    assert budget.parse_size("2GiB") == 2 << 30
    assert budget.parse_size("1.5g") == 3 << 29
    assert budget.parse_size("4096") == 4096
    assert budget.parse_size("auto") is None
    for bad in ("", "-1G", "12 parsecs", "1e9", "G"):
        with pytest.raises(budget.BudgetSyntaxError):
            budget.parse_size(bad)


def test_default_follows_the_notebooks_data_within_host_bounds() -> None:
    host = 16 << 30
    assert budget.default_budget(10 * MIB, host) == budget.FLOOR           # small notebooks keep everything
    assert budget.default_budget(1 << 30, host) == 1 << 30                # as much as the data ...
    assert budget.default_budget(10 << 30, host) == host // budget.HOST_SHARE  # ... at most 1/8 of RAM
    assert budget.default_budget(10 * MIB, 1 << 30) == (1 << 30) // budget.HOST_SHARE  # tiny host


def test_environment_setting_is_validated_at_kernel_start() -> None:
    assert budget.from_env({budget.ENV: "3G"}) == 3 << 30
    assert budget.from_env({}) is None
    KernelSettings.from_env({budget.ENV: "1G"})
    with pytest.raises(KernelConfigError, match=budget.ENV):
        KernelSettings.from_env({budget.ENV: "lots"})


def test_budget_magic_parses() -> None:
    assert mg.split_cell("%sandbox checkpoints budget 2G").magics == (mg.SandboxCommand("checkpoints", "budget", "2G"),)
    assert mg.split_cell("%sandbox checkpoints budget").magics == (mg.SandboxCommand("checkpoints", "budget", None),)
    assert mg.split_cell("%sandbox checkpoints").magics == (mg.SandboxCommand("checkpoints"),)
    for bad in ("%sandbox checkpoints budget lots", "%sandbox checkpoints sizes", "%sandbox checkpoints budget 1G 2G"):
        with pytest.raises(mg.MagicUsageError):
            mg.split_cell(bad)


# ---- in a session ----

def test_oldest_checkpoints_go_first_and_the_user_is_told(template) -> None:
    s = Session(template, checkpoint_memory=160 * MIB, checkpoint_disk=0)
    try:
        stderr: list[str] = []
        run(s, "import numpy as np", 1, stderr)
        for n in range(2, 10):
            assert run(s, CELL.format(n=n), n, stderr)["status"] == "ok"
            assert s.checkpoint_memory() <= 160 * MIB or len(s.checkpoints) == 0
        numbers = [cp.number for cp in s.checkpoints]
        # the newest ones survive, oldest first out: a contiguous run ending at the last cell
        assert numbers and numbers == list(range(10 - len(numbers), 10)), numbers
        assert len(numbers) < 9 and s.budget_dropped >= 9 - len(numbers)
        info = s.describe_budget()
        assert info["rewind_depth"] == len(numbers) and not info["over_budget"]
        assert "dropped" in info["why"] and "160 MiB" in info["why"]
        text = mg.format_checkpoints(s.describe_checkpoints(), s.mode, info)
        assert f"%rewind can go back {len(numbers)} cell(s)" in text and "160 MiB" in text
        # told once, at the start of the cell after the first drop
        notes = [t for t in stderr if "budget" in t]
        assert len(notes) == 1 and "dropped the oldest" in notes[0] and "%sandbox checkpoints budget" in notes[0]
        # rewinding as deep as kept works; one more says why not
        depth = len(numbers)
        with pytest.raises(SandboxError, match="budget"):
            s.rewind(depth + 1)
        s.rewind(depth)
        assert run(s, "print(a[0])", 20)["stdout"].strip() == f"{10 - depth - 1}.0"
    finally:
        s.close()


def test_crash_rollback_still_works_when_the_budget_is_full(template) -> None:
    s = Session(template, checkpoint_memory=100 * MIB, checkpoint_disk=0)
    try:
        run(s, "import numpy as np", 1)
        for n in range(2, 7):
            run(s, CELL.format(n=n), n)
        assert s.budget_dropped > 0
        reply = run(s, "a[:] = -1\nimport ctypes\nctypes.string_at(0)", 7)
        assert reply["status"] == "error" and reply["ename"] == "SandboxCrashed"
        assert run(s, "print(a[0], a[-1])", 8)["stdout"].strip() == "6.0 6.0"
    finally:
        s.close()


def test_a_checkpoint_alone_over_the_budget_is_kept_and_said(template) -> None:
    s = Session(template, checkpoint_memory=16 * MIB, checkpoint_disk=0)
    try:
        stderr: list[str] = []
        run(s, "import numpy as np", 1, stderr)
        run(s, CELL.format(n=2), 2, stderr)
        run(s, CELL.format(n=3), 3, stderr)
        info = s.describe_budget()
        assert info["over_budget"] and info["held_bytes"] > 16 * MIB
        assert "kept anyway" in info["why"]
        assert any("over its budget" in t for t in stderr), stderr
        # the kept checkpoint still rolls a crash back
        reply = run(s, "a[:] = 0\nimport ctypes\nctypes.string_at(0)", 4)
        assert reply["ename"] == "SandboxCrashed"
        assert run(s, "print(a[0])", 5)["stdout"].strip() == "3.0"
        # a budget the checkpoints fit in: no longer over, and no longer said to be
        s.set_budget(1 << 30)
        info = s.describe_budget()
        assert not info["over_budget"] and "kept anyway" not in info["why"], info
    finally:
        s.close()


def test_raising_and_lowering_the_budget_applies_at_once(template) -> None:
    s = Session(template, checkpoint_memory=1 << 30, spill_waits=True)
    try:
        run(s, "import numpy as np", 1)
        for n in range(2, 6):
            run(s, CELL.format(n=n), n)
        assert len(s.checkpoints) == 5 and s.budget_dropped == 0
        text = s.set_budget(80 * MIB)
        assert "80 MiB (set)" in text
        # the oldest leave memory for the spill file: still 5 to rewind to
        in_memory = sum(1 for cp in s.checkpoints if cp.snapshot is not None)
        assert in_memory < 5 and len(s.checkpoints) == 5 and s.checkpoint_memory() <= 80 * MIB
        assert s.describe_budget()["on_disk"] == 5 - in_memory
        s.set_budget(None)
        assert s.describe_budget()["budget_source"] == "default"
    finally:
        s.close()


# ---- through the Jupyter kernel (env setting, magic, stderr notice) ----

@pytest.mark.kvm
def test_budget_through_the_kernel() -> None:
    from kernel_helpers import execute, kernel, stream_text

    with kernel("zeroboot", ZEROBOOT_CHECKPOINT_MEMORY="100M", ZEROBOOT_CHECKPOINT_DISK="0") as (_, kc):
        reply, msgs = execute(kc, "%sandbox checkpoints budget")
        assert reply["status"] == "ok" and "100 MiB (set)" in stream_text(msgs)
        execute(kc, "import numpy as np")
        notices = []
        for n in range(2, 7):
            reply, msgs = execute(kc, CELL.format(n=n))
            assert reply["status"] == "ok"
            notices.append(stream_text(msgs, "stderr"))
        assert sum("dropped the oldest" in t for t in notices) == 1, notices
        reply, msgs = execute(kc, "%sandbox checkpoints")
        text = stream_text(msgs)
        assert "%rewind can go back" in text and "dropped to keep" in text, text
        reply, msgs = execute(kc, "%sandbox stats")
        assert "checkpoint memory / budget" in stream_text(msgs) and "%rewind depth" in stream_text(msgs)
        reply, msgs = execute(kc, "%sandbox checkpoints budget 2G")
        assert reply["status"] == "ok" and "2,048 MiB (set)" in stream_text(msgs)
        reply, _ = execute(kc, "%sandbox checkpoints budget lots")
        assert reply["status"] == "error" and reply["ename"] == "UsageError"
