"""eventfd (issue 12's proof that a file kind is one file plus one registration): the syscalls of
a guest with no CPython (guest_programs/eventfd.c), the counter across snapshots, saved templates
and forks, and Python's os.eventfd in a notebook session, across cells and a rewind."""
from __future__ import annotations


import pytest

import guest_c
from session_helpers import cell
from zeroboot_kernel.session import Session


@pytest.mark.parametrize("test", ["create", "counter", "semaphore", "ready"])
def test_eventfd_syscalls(test: str) -> None:
    guest_c.check("eventfd", test)


def test_counters_survive_snapshots_saves_and_forks(tmp_path) -> None:
    guest_c.check_state_survives_snapshots("eventfd", tmp_path)  # forks share no counter


def test_python_eventfd_across_cells_and_rewind(template) -> None:
    s = Session(template)
    try:
        r = cell(s, "import os, select\n"
                    "efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)\n"
                    "os.eventfd_write(efd, 3)\n"
                    "p = select.poll(); p.register(efd, select.POLLIN)\n"
                    "print(p.poll(0) == [(efd, select.POLLIN)])", 1)
        assert r["status"] == "ok" and r["stdout"].strip() == "True", r
        r = cell(s, "os.eventfd_write(efd, 4)\nprint(os.eventfd_read(efd))", 2)
        assert r["status"] == "ok" and r["stdout"].strip() == "7", r
        r = cell(s, "try:\n    os.eventfd_read(efd)\nexcept BlockingIOError:\n    print('empty')", 3)
        assert r["status"] == "ok" and r["stdout"].strip() == "empty", r
        s.rewind(2)  # back to the state after cell 1: the counter is 3 again
        r = cell(s, "print(os.eventfd_read(efd), p.poll(0))", 4)
        assert r["status"] == "ok" and r["stdout"].strip() == "3 []", r
        r = cell(s, "sem = os.eventfd(2, os.EFD_SEMAPHORE | os.EFD_NONBLOCK)\n"
                    "print(os.eventfd_read(sem), os.eventfd_read(sem))", 5)
        assert r["status"] == "ok" and r["stdout"].strip() == "1 1", r
    finally:
        s.close()
