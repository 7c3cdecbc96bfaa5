"""bench load's process counters (zeroboot_kernel/bench/load.py): the process tree and the
context switches it reads from /proc."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from zeroboot_kernel.bench import load

pytestmark = pytest.mark.without_kvm


def test_tree_has_the_children() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in load._tree(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_a_sleep_is_a_voluntary_switch() -> None:
    before = load._counters([os.getpid()])
    for _ in range(3):
        time.sleep(0.01)
    after = load._counters([os.getpid()])
    assert after["voluntary"] - before["voluntary"] >= 3
    assert load._counters([2**22 + 12345]) == {"voluntary": 0, "nonvoluntary": 0, "cpu_ticks": 0}  # gone: nothing
