"""memfd_create and seals, sendfile, copy_file_range, getpriority/setpriority, pipe sizes and whole
blocking pipe writes of a guest with no CPython (guest_programs/syscall_gaps.c), in the guest and
on Linux, and their state across snapshots, saved templates and forks."""
from __future__ import annotations

import subprocess

import pytest

import guest_c

TESTS = ["memfd", "seals", "sendfile", "copy_file_range", "priority", "pipe_size", "whole_write"]


@pytest.mark.parametrize("test", TESTS)
def test_syscall_gaps(test: str) -> None:
    guest_c.check("syscall_gaps", test)


@pytest.mark.parametrize("test", TESTS)
def test_the_program_passes_on_linux(test: str) -> None:
    """The checks are Linux's behaviour, not the engine's: the same binary passes on the host."""
    binary = guest_c.build("syscall_gaps")
    proc = subprocess.run([str(binary), test], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and f"PASS {test}" in proc.stdout, proc.stderr


def test_memfd_pipe_size_and_nice_survive_snapshots_saves_and_forks(tmp_path):
    guest_c.check_state_survives_snapshots("syscall_gaps", tmp_path)
