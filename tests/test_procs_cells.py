"""Processes in notebook cells (issue 15): os.fork() + os.waitpid in a cell, a child's writes to
fd 1 reach the cell, a child's crash is only the child's, a child kept alive across cells (no
checkpoint while it lives, said once per cell), a rollback and %rewind end the children."""
from __future__ import annotations

import os
import threading

import pytest

from session_helpers import cell, ok
from zeroboot_kernel.native import Guest
from zeroboot_kernel.session import Session


@pytest.fixture
def s(template):
    session = Session(template)
    yield session
    session.close()


def test_fork_and_wait_in_a_cell(s: Session) -> None:
    out = ok(cell(s, "import os, signal\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    os.write(1, b'child %d of %d\\n' % (os.getpid(), os.getppid()))\n"
                     "    os._exit(7)\n"
                     "p, st = os.waitpid(pid, 0)\n"
                     "print(p == pid, os.waitstatus_to_exitcode(st), os.getpid())\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    os.kill(os.getpid(), signal.SIGKILL)\n"
                     "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
                     "r, w = os.pipe()\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    os.close(r); os.write(w, b'through a pipe'); os._exit(0)\n"
                     "os.close(w)\n"
                     "print(os.read(r, 100).decode(), os.read(r, 100), os.waitpid(pid, 0)[1])", 1))
    assert "child " in out and " of 1\n" in out, out
    assert out.endswith("True 7 1\n-9\nthrough a pipe b'' 0\n"), out
    assert ok(cell(s, "print('after', 1 + 1)", 2)) == "after 2\n"
    assert s.sandbox.guest.process_count() == 1


def test_a_forked_childs_print_reaches_the_cell(s: Session) -> None:
    """A child's print() through the agent's sys.stdout/sys.stderr reaches the cell, as under
    ipykernel (its OutStream forwards a forked child's text): text pending at the fork is printed
    once (the parent's), a child's exception shows its traceback, and display() in a child says
    that it cannot reach the notebook instead of vanishing."""
    streams: list[tuple[str, str]] = []
    reply = s.execute("import os, sys\n"
                      "print('before', end='')  # pending in the parent's buffer at the fork\n"
                      "pid = os.fork()\n"
                      "if pid == 0:\n"
                      "    print(' child says hi')\n"
                      "    print('child err', file=sys.stderr)\n"
                      "    sys.stdout.flush()\n"
                      "    os._exit(0)\n"
                      "os.waitpid(pid, 0)\n"
                      "pid = os.fork()\n"
                      "if pid == 0:\n"
                      "    try:\n"
                      "        display('shown?')\n"
                      "    finally:\n"
                      "        os._exit(0)\n"
                      "os.waitpid(pid, 0)\n"
                      "print('|parent')", execution_count=1,
                      on_stream=lambda name, text: streams.append((name, text)))
    assert reply["status"] == "ok", reply
    out = "".join(t for n, t in streams if n == "stdout")
    err = "".join(t for n, t in streams if n == "stderr")
    assert out.count("before") == 1 and " child says hi\n" in out and out.endswith("|parent\n"), streams
    assert "child err\n" in err, streams
    assert "is a fork of the kernel" in err and "DISPLAY" in err, streams
    # an exception in a child that does not catch it: its traceback is the child's stderr
    streams.clear()
    reply = s.execute("pid = os.fork()\n"
                      "if pid == 0:\n"
                      "    try:\n"
                      "        1 / 0\n"
                      "    except ZeroDivisionError:\n"
                      "        import traceback; traceback.print_exc()\n"
                      "    os._exit(1)\n"
                      "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))", execution_count=2,
                      on_stream=lambda name, text: streams.append((name, text)))
    assert reply["status"] == "ok", reply
    assert "ZeroDivisionError" in "".join(t for n, t in streams if n == "stderr"), streams
    assert "".join(t for n, t in streams if n == "stdout").endswith("1\n"), streams
    assert ok(cell(s, "print('after')", 3)) == "after\n"


def test_a_child_crash_is_the_childs_only(s: Session) -> None:
    out = ok(cell(s, "import os, ctypes\n"
                     "x = 41\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    ctypes.string_at(0)\n"
                     "st = os.waitpid(pid, 0)[1]\n"
                     "x += 1\n"
                     "print(os.WIFSIGNALED(st), os.WTERMSIG(st))", 1))
    assert out == "True 11\n", out
    assert ok(cell(s, "print(x)", 2)) == "42\n"


def test_multiprocessing_fork_pool_is_refused_or_works(s: Session) -> None:
    """multiprocessing's fork context needs MAP_SHARED memory across fork for its locks, which
    is not done yet: whatever it does, the cell ends and the sandbox goes on."""
    reply = cell(s, "import multiprocessing as mp\n"
                    "try:\n"
                    "    with mp.get_context('fork').Pool(2) as p:\n"
                    "        print(sum(p.map(abs, range(-5, 5))))\n"
                    "except Exception as e:\n"
                    "    print('refused:', type(e).__name__)\n", 1)
    assert reply["status"] in ("ok", "error"), reply
    assert ok(cell(s, "print('alive')", 2)) == "alive\n"


def test_children_across_cells_rollback_and_rewind(s: Session) -> None:
    base = Guest.child_processes_alive()
    ok(cell(s, "import os\nkept = 1", 1))
    out = ok(cell(s, "r, w = os.pipe()\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    os.close(w); os.read(r, 1); os._exit(3)\n"
                     "os.close(r)\nprint('started')", 2))
    assert out == "started\n"
    assert s.sandbox.guest.process_count() == 2
    # the child lives: the next cell runs without a checkpoint of its own, and says so
    reply = cell(s, "kept = 2\nprint(os.waitpid(pid, os.WNOHANG))", 3)
    assert reply["status"] == "ok" and "no checkpoint of its own" in reply["stdout"], reply
    assert "(0, 0)" in reply["stdout"]
    # the child is waited for: checkpoints come back
    out = ok(cell(s, "os.write(w, b'x'); print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))", 4))
    assert out.endswith("3\n") and s.sandbox.guest.process_count() == 1, out
    # a child left alive, then a crash: the rollback ends it
    ok(cell(s, "r2, w2 = os.pipe()\npid2 = os.fork()\n"
               "if pid2 == 0:\n    os.read(r2, 1); os._exit(0)\n", 5))
    assert s.sandbox.guest.process_count() == 2
    reply = cell(s, "import ctypes; ctypes.string_at(0)", 6)
    assert reply["status"] == "error", reply
    assert s.sandbox.guest.process_count() == 1
    assert Guest.child_processes_alive() == base
    assert ok(cell(s, "print(kept)", 7)) == "2\n"
    # %rewind past a cell that started a child
    ok(cell(s, "r3, w3 = os.pipe()\npid3 = os.fork()\n"
               "if pid3 == 0:\n    os.read(r3, 1); os._exit(0)\nkept = 3", 8))
    assert s.sandbox.guest.process_count() == 2
    s.rewind(1)
    assert s.sandbox.guest.process_count() == 1
    assert Guest.child_processes_alive() == base
    assert ok(cell(s, "print(kept)", 9)) == "2\n"


def test_an_interrupt_reaches_the_foreground_process_group(s: Session) -> None:
    ok(cell(s, "import os, signal, time\n"
               "pid = os.fork()\n"
               "if pid == 0:\n"
               "    signal.signal(signal.SIGINT, lambda *a: os._exit(5))\n"
               "    while True: time.sleep(1)\n"
               "r, w = os.pipe()\n"
               "other = os.fork()\n"
               "if other == 0:\n"
               "    os.setpgid(0, 0)  # its own group: not the foreground one\n"
               "    signal.signal(signal.SIGINT, lambda *a: os._exit(6))\n"
               "    os.read(r, 1); os._exit(0)\n", 1))
    done = threading.Event()

    def interrupt_until_done() -> None:  # again until the cell ends: one sent before it starts is dropped
        while not done.wait(0.5):
            s.sandbox.interrupt()

    threading.Thread(target=interrupt_until_done, daemon=True).start()
    try:
        r = cell(s, "os.waitpid(pid, 0)", 2)
    finally:
        done.set()
    assert r["status"] == "error" and r["ename"] == "KeyboardInterrupt", r
    out = ok(cell(s, "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
                     "print(os.waitpid(other, os.WNOHANG))\n"
                     "os.write(w, b'x'); print(os.waitstatus_to_exitcode(os.waitpid(other, 0)[1]))", 3))
    assert out.endswith("5\n(0, 0)\n0\n"), out


def test_fork_in_the_kernel_under_the_engines_seccomp_filters() -> None:
    """Through the real kernel: the engine process runs under its run-phase seccomp filters, and a
    guest fork makes no host process or thread (the engine's children stay as they were)."""
    from kernel_helpers import engine_pid_of, execute, kernel, stream_text

    with kernel("zeroboot") as (km, kc):
        engine = engine_pid_of(km)
        assert execute(kc, "1 + 1")[0]["status"] == "ok"  # the engine's own threads are up after a first cell
        tasks_before = sorted(os.listdir(f"/proc/{engine}/task"))
        reply, msgs = execute(kc, "import os\npid = os.fork()\nif pid == 0:\n    os._exit(3)\n"
                                  "print('status', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))")
        assert reply["status"] == "ok" and stream_text(msgs) == "status 3\n", (reply, msgs)
        assert sorted(os.listdir(f"/proc/{engine}/task")) == tasks_before
        assert not [p for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == engine]


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1
