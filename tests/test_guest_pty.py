"""Pseudo-terminals (issue 15): /dev/ptmx, openpty/forkpty, the line discipline, termios and window
size, the pty limit and hostile arguments, from a guest with no CPython (guest_programs/pty.c),
and a pty across snapshots, saved templates and forks."""
from __future__ import annotations

import pytest

import guest_c


@pytest.mark.parametrize("test", ["openpt", "limit", "io", "termios", "hostile", "fork", "pts"])
def test_pty_syscalls(test: str) -> None:
    guest_c.check("pty", test)


def test_pty_survives_snapshots_saves_and_forks(tmp_path) -> None:
    guest_c.check_state_survives_snapshots("pty", tmp_path)
