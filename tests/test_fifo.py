"""Named pipes (FIFOs): mkfifo and mknod(S_IFIFO) in the sandbox's own files, open's waiting rules,
one pipe per node shared by its opens (guest_programs/fifo.c, checked against the host's Linux),
the node and an open FIFO's bytes across snapshots, and FIFOs in notebook cells: os.mkfifo with
fork and subprocess, the shell's `mkfifo p; cat p & echo hi > p`, O_NONBLOCK, stat, a FIFO in a
read-write notebook folder, and an open that nobody answers, ended by the cell's time limit."""
from __future__ import annotations

import threading

import pytest

import guest_c
from session_helpers import cell, ok
from zeroboot_kernel.session import Session

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


def test_mkfifo_with_a_forked_reader_and_writer(s: Session) -> None:
    """os.mkfifo, stat and a blocking open on both sides of a fork; the node, and an O_RDWR end
    with unread bytes, stay across cells (the checkpoint between them holds both)."""
    out = ok(cell(s, "import os, stat\n"
                     "os.mkfifo('/tmp/f1', 0o640)\n"
                     "st = os.stat('/tmp/f1')\n"
                     "print(stat.S_ISFIFO(st.st_mode), oct(stat.S_IMODE(st.st_mode)), st.st_size)\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    with open('/tmp/f1', 'w') as w:\n"
                     "        w.write('from the child\\n')\n"
                     "    os._exit(0)\n"
                     "with open('/tmp/f1') as r:\n"
                     "    print(r.read(), end='')\n"
                     "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))", 1))
    assert out == "True 0o640 0\nfrom the child\n0\n", out
    assert ok(cell(s, "fd = os.open('/tmp/f1', os.O_RDWR)\nprint(os.write(fd, b'queued'))", 2)) == "6\n"
    assert ok(cell(s, "print(stat.S_ISFIFO(os.stat('/tmp/f1').st_mode), os.read(fd, 10))", 3)) == "True b'queued'\n"


def test_the_shell_idiom_through_subprocess(s: Session) -> None:
    """`mkfifo p; cat p & echo hi > p` in /bin/sh (subprocess, then `!` on a pty, where the shell
    waits for cat: its exit would hang cat up, as on Linux), and ls -l's `p`."""
    out = ok(cell(s, "import subprocess\n"
                     "for script in ('cd /tmp && mkfifo p && (cat p &) && echo hi > p',\n"
                     "               'cd /tmp && rm p && mkfifo p; cat p & echo there > p; wait',\n"
                     "               'ls -l /tmp/p | cut -c1'):\n"
                     "    r = subprocess.run(['/bin/sh', '-c', script], capture_output=True, text=True)\n"
                     "    print(r.returncode, r.stdout + r.stderr, end='|')", 1))
    assert out == "0 hi\n|0 there\n|0 p\n|", out
    out = ok(cell(s, "!cd /tmp && rm p && mkfifo p; cat p & echo again > p; wait", 2))
    assert out.replace("\r", "") == "again\n", out


def test_nonblocking_opens(s: Session) -> None:
    out = ok(cell(s, "import os, errno\n"
                     "os.mkfifo('/tmp/nb')\n"
                     "try:\n"
                     "    os.open('/tmp/nb', os.O_WRONLY | os.O_NONBLOCK)\n"
                     "except OSError as e:\n"
                     "    print(errno.errorcode[e.errno])\n"
                     "r = os.open('/tmp/nb', os.O_RDONLY | os.O_NONBLOCK)\n"
                     "print(os.read(r, 10))\n"
                     "w = os.open('/tmp/nb', os.O_WRONLY | os.O_NONBLOCK)\n"
                     "os.write(w, b'abc')\n"
                     "print(os.read(r, 10))\n"
                     "try:\n"
                     "    os.read(r, 10)\n"
                     "except BlockingIOError:\n"
                     "    print('EAGAIN')\n"
                     "os.close(w)\n"
                     "print(os.read(r, 10))\n"
                     "os.close(r)\n"
                     "rw = os.open('/tmp/nb', os.O_RDWR)\n"
                     "os.write(rw, b'self'); print(os.read(rw, 10))", 1))
    assert out == "ENXIO\nb''\nb'abc'\nEAGAIN\nb''\nb'self'\n", out


def test_a_thread_blocked_in_open_across_cells(s: Session) -> None:
    """A thread whose open waits for a writer when its cell ends (the checkpoint is taken then)
    goes on once the next cell opens the FIFO for writing."""
    ok(cell(s, "import os, threading\n"
               "os.mkfifo('/tmp/bg')\n"
               "got = []\n"
               "t = threading.Thread(target=lambda: got.append(open('/tmp/bg').read()))\n"
               "t.start()", 1))
    out = ok(cell(s, "with open('/tmp/bg', 'w') as w:\n"
                     "    w.write('late')\n"
                     "t.join()\n"
                     "print(got)", 2))
    assert out == "['late']\n", out


def test_a_fifo_in_a_readwrite_folder_is_eperm(template, tmp_path) -> None:
    """mknod(S_IFIFO) never makes a node on the host: EPERM in a read-write notebook folder; in
    the overlay mode the FIFO is the sandbox's own and the host folder gets nothing."""
    s = Session(template, project_dir=str(tmp_path), files="readwrite")
    try:
        out = ok(cell(s, "import os\n"
                         "try:\n"
                         "    os.mkfifo('p')\n"
                         "except PermissionError as e:\n"
                         "    print('EPERM', e.errno)\n"
                         "os.mkfifo('/tmp/ok'); print(os.path.exists('p'))", 1))
        assert out == "EPERM 1\nFalse\n", out
    finally:
        s.close()
    assert not (tmp_path / "p").exists()
    s = Session(template, project_dir=str(tmp_path), files="overlay")
    try:
        out = ok(cell(s, "import os, stat\nos.mkfifo('q')\nprint(stat.S_ISFIFO(os.stat('q').st_mode))", 1))
        assert out == "True\n", out
    finally:
        s.close()
    assert list(tmp_path.iterdir()) == []


def test_an_open_nobody_answers_ends_with_the_time_limit_and_the_interrupt(template) -> None:
    s = Session(template, timeout=3)
    try:
        ok(cell(s, "import os, errno\nos.mkfifo('/tmp/lonely')", 1))
        r = cell(s, "open('/tmp/lonely')", 2)  # waits for a writer nobody will be
        assert r["status"] == "error" and r["ename"] == "SandboxTimeout", r
        threading.Timer(0.5, s.sandbox.interrupt).start()
        r = cell(s, "os.open('/tmp/lonely', os.O_WRONLY)", 3)  # ... for a reader
        assert r["status"] == "error" and r["ename"] == "KeyboardInterrupt", r
        # the interrupted writer is none: a reader that does not wait reads EOF
        out = ok(cell(s, "r = os.open('/tmp/lonely', os.O_RDONLY | os.O_NONBLOCK)\n"
                         "print(os.read(r, 5))\n"
                         "try:\n"
                         "    os.open('/tmp/lonely', os.O_WRONLY | os.O_NONBLOCK); print('a reader')\n"
                         "except OSError as e:\n"
                         "    print(errno.errorcode[e.errno])", 4))
        assert out == "b''\na reader\n", out
    finally:
        s.close()
