"""Named pipes (FIFOs): mkfifo and mknod(S_IFIFO) in the sandbox's own files, open's waiting rules,
one pipe per node shared by its opens (guest_programs/fifo.c, checked against the host's Linux),
the node and an open FIFO's bytes across snapshots, and FIFOs in notebook cells: os.mkfifo with
fork and subprocess, the shell's `mkfifo p; cat p & echo hi > p`, O_NONBLOCK, stat, a FIFO in a
read-write notebook folder, and an open that nobody answers, ended by the cell's time limit."""
from __future__ import annotations

import pytest

import guest_c

GUEST_TESTS = ["node", "nonblock", "fork", "interrupt"]


@pytest.mark.parametrize("test", GUEST_TESTS)
def test_fifo_syscalls(test: str) -> None:
    guest_c.check("fifo", test)


@pytest.mark.skipif(not guest_c.have_gcc(), reason="needs gcc")
@pytest.mark.parametrize("test", GUEST_TESTS)
def test_fifo_syscalls_on_linux(test: str) -> None:
    guest_c.check_on_linux("fifo", test)


def test_fifo_survives_snapshots_saves_and_forks(tmp_path) -> None:
    guest_c.check_state_survives_snapshots("fifo", tmp_path)
