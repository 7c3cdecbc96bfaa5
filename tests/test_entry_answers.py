"""Syscalls the syscall entry page answers in the guest (issue 24; guest_abi.h zb_entry_data):
getpid, getuid/geteuid and getgid/getegid without a VM exit on PVM hosts. The answers must be the
host path's answers in every process of a family (fork, exec, threads), and returning to user code
from the entry must leave the guest in user mode (supervisor-only pages still fault)."""
from __future__ import annotations

import json

import pytest

from session_helpers import cell, ok
from zeroboot_kernel.native import Engine
from zeroboot_kernel.session import Session


def answers_on() -> bool:
    return Engine.default().set_syscall_path()[2]


@pytest.fixture
def s(template):
    session = Session(template)
    yield session
    session.close()


IDS = "[os.getpid(), os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getppid()]"


def test_answers_are_the_host_paths_and_cost_no_exit(template) -> None:
    engine = Engine.default()
    with template.fork() as sb:
        try:
            engine.set_syscall_path(guest_answers=False)
            r = sb.execute(f"import os\nprint({IDS})")
            host = json.loads(r.stdout.strip().splitlines()[-1])
        finally:
            engine.set_syscall_path()
        r = sb.execute(f"import os\nprint({IDS})")
        assert json.loads(r.stdout.strip().splitlines()[-1]) == host
        st0 = sb.guest.stats()
        r = sb.execute("import os\nfor _ in range(2000): os.getpid(); os.getuid(); os.getegid()")
        assert not r.error, r.error
        calls = sb.guest.stats()["syscalls"] - st0["syscalls"]
    if answers_on():
        assert calls < 100, calls  # the cell's own few, not 6,000
    else:
        assert calls >= 6000, calls


def test_fork_exec_and_threads_see_their_own_pid(s: Session) -> None:
    out = ok(cell(s, "import json, os, threading\n"
                     "me = os.getpid()\n"
                     "r, w = os.pipe()\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    os.close(r)\n"
                     "    os.write(w, b'%d %d ' % (os.getpid(), os.getppid()))\n"
                     "    pid2 = os.fork()\n"  # a grandchild
                     "    if pid2 == 0:\n"
                     "        os.write(w, b'%d ' % os.getpid()); os._exit(0)\n"
                     "    os.waitpid(pid2, 0)\n"
                     "    os.write(w, b'%d ' % pid2)\n"
                     "    os.dup2(w, 1)\n"
                     "    os.execv('/bin/sh', ['sh', '-c', 'echo $$'])\n"  # after exec: the same pid
                     "os.close(w)\n"
                     "got = b''\n"
                     "while True:\n"
                     "    b = os.read(r, 100)\n"
                     "    if not b: break\n"
                     "    got += b\n"
                     "os.waitpid(pid, 0)\n"
                     "tids, pids = [], []\n"
                     "def t():\n"
                     "    tids.append(threading.get_native_id()); pids.append(os.getpid())\n"
                     "ts = [threading.Thread(target=t) for _ in range(2)]\n"
                     "[x.start() for x in ts]; [x.join() for x in ts]\n"
                     "print(json.dumps([me, pid, got.decode().split(), os.getpid(), threading.get_native_id(), tids, pids]))", 1))
    me, pid, got, after, main_tid, tids, pids = json.loads(out.strip().splitlines()[-1])
    child, child_ppid, grandchild, pid2, after_exec = (int(x) for x in got)
    assert child == pid and child_ppid == me and after == me, out
    assert grandchild == pid2 and grandchild not in (me, pid), out
    assert after_exec == pid, out
    assert pids == [me, me], out
    assert len({main_tid, *tids}) == 3 and main_tid == me, out


# mov eax, 39 (getpid); syscall; then read a supervisor-only page (the PML4 at 0x1000) into rax; ret
_AFTER_ANSWER = r'''
import ctypes, mmap
prog = bytes([0xb8, 39, 0, 0, 0, 0x0f, 0x05]) + bytes([0x48, 0x8b, 0x04, 0x25, 0x00, 0x10, 0x00, 0x00, 0xc3])
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(prog)
f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print("read", hex(f()))
'''


def test_user_code_after_an_answer_is_still_user_mode(template) -> None:
    from zeroboot_kernel.errors import SandboxCrashed

    with template.fork() as sb:
        with pytest.raises(SandboxCrashed, match="SIGSEGV: read at address 0x1000"):
            sb.execute(_AFTER_ANSWER)


# jump to the getpid slot's `movl` directly (rcx = the ret): only the guest's own answer, at CPL3
_INTO_SLOT = r'''
import ctypes, mmap, os
# lea rcx, [rip + 13]; movabs r11, 0xe040 (ZB_ENTRY_SLOTS); jmp r11; ret
prog = bytes([0x48, 0x8d, 0x0d, 13, 0, 0, 0, 0x49, 0xbb]) + (0xe040).to_bytes(8, "little") + bytes([0x41, 0xff, 0xe3, 0xc3])
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(prog)
f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print([f(), os.getpid(), ctypes.string_at(0xe800, 4).hex()])
'''


def test_a_jump_into_an_answer_slot_only_reads_the_answer(template) -> None:
    with template.fork() as sb:
        r = sb.execute(_INTO_SLOT)
        assert not r.error, r.error
        got, pid, on = json.loads(r.stdout.strip().splitlines()[-1].replace("'", '"'))
    if answers_on():
        assert got == pid and on == (0x7a627361).to_bytes(4, "little").hex()
    else:
        assert on == "00000000"


def test_an_alarm_that_stops_the_guest_inside_an_answer_is_delivered_at_once(template) -> None:
    """A host signal can stop the vCPU inside the entry's in-guest answer (after `syscall`, before
    its jump back). The engine moves it to the entry's `out` so that the host serves the call and
    delivers the signal right after it; left there, a one-shot SIGALRM would wait for the guest's
    next exit, which a loop of getpids never makes: the cell would hang. Where the alarm lands is
    up to the host's timing; the test passes whatever it is, and 1,000 alarms make landing inside
    an answer (the case it checks) likely."""
    code = r'''
import os, signal
got = [0]
def on_alarm(sig, frame): got[0] += 1
signal.signal(signal.SIGALRM, on_alarm)
g = os.getpid
for i in range(1000):
    signal.setitimer(signal.ITIMER_REAL, 0.0002)
    while got[0] <= i:
        g(); g(); g(); g(); g(); g(); g(); g()
print(got[0])
'''
    with template.fork() as sb:
        r = sb.execute(code, timeout=120)  # a hang guard only
        assert not r.error, r.error
        assert r.stdout.strip().splitlines()[-1] == "1000"
