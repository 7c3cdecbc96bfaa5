"""Advisory file locks between the processes of a sandbox (native/file_lock.c): flock, fcntl record
locks, OFD locks and lockf, checked against the host's Linux (guest_programs/file_locks.c), and
in a notebook cell: `flock -n` of a file a cell holds locked fails, as under ipykernel. Before,
every lock call succeeded without locking anything, so processes that relied on a lock (sqlite,
filelock, a `flock` in a script) ran together without a word."""
from __future__ import annotations

import pytest

import guest_c
from session_helpers import cell, ok

GUEST_TESTS = ["flock", "record", "ofd", "lockf", "bad_requests", "deadlock"]


@pytest.mark.parametrize("test", GUEST_TESTS)
def test_file_lock_syscalls(test: str) -> None:
    guest_c.check("file_locks", test)


@pytest.mark.skipif(not guest_c.have_gcc(), reason="needs gcc")
@pytest.mark.parametrize("test", GUEST_TESTS)
def test_file_lock_syscalls_on_linux(test: str) -> None:
    guest_c.check_on_linux("file_locks", test)


def test_a_lock_held_by_the_cell_excludes_its_subprocesses(template) -> None:
    from zeroboot_kernel.session import Session
    s = Session(template, timeout=60)
    try:
        out = ok(cell(s, "import fcntl, subprocess\n"
                         "f = open('/tmp/lockfile', 'w')\n"
                         "fcntl.flock(f, fcntl.LOCK_EX)\n"
                         "held = subprocess.run(['flock', '-n', '/tmp/lockfile', 'true']).returncode\n"
                         "fcntl.flock(f, fcntl.LOCK_UN)\n"
                         "free = subprocess.run(['flock', '-n', '/tmp/lockfile', 'true']).returncode\n"
                         "print(held, free)", 1))
        assert out == "1 0\n", out
        # a lock kept across cells still excludes (the checkpoint between them keeps the process)
        ok(cell(s, "fcntl.lockf(f, fcntl.LOCK_EX)", 2))
        out = ok(cell(s, "import multiprocessing as mp\n"
                         "def probe(q):\n"
                         "    g = open('/tmp/lockfile', 'w')\n"
                         "    try:\n"
                         "        fcntl.lockf(g, fcntl.LOCK_EX | fcntl.LOCK_NB); q.put('got it')\n"
                         "    except OSError as e:\n"
                         "        q.put(type(e).__name__)\n"
                         "q = mp.Queue(); p = mp.Process(target=probe, args=(q,)); p.start(); print(q.get(timeout=60)); p.join()", 3))
        assert out == "BlockingIOError\n" or out == "PermissionError\n", out
    finally:
        s.close()
