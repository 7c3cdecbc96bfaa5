"""Processes in the guest (issue 15): fork/vfork/clone as copy-on-write sandbox forks, waiting,
exit and signal statuses, pipes between processes with blocking reads, SIGCHLD, process groups,
kill across processes, PR_SET_PDEATHSIG, the process limit, hostile arguments, and that every
child sandbox goes away with its family (guest_programs/procs.c)."""
from __future__ import annotations

import time

import pytest

import guest_c
from zeroboot_kernel.native import Engine, EventKind, Guest

pytestmark = pytest.mark.skipif(not guest_c.have_gcc(), reason="needs gcc for the guest programs")


@pytest.mark.parametrize("test", ["fork_wait", "killed", "pipes", "sigchld", "wnohang_zombies", "groups", "vfork",
                                  "fork_in_thread", "sigpipe_pdeathsig", "hostile", "bomb"])
def test_processes(test: str) -> None:
    guest_c.check("procs", test)


@pytest.mark.parametrize("parent", ["sleep", "spin"])
def test_child_alarm_interrupts_its_wait(parent: str) -> None:
    """A forked child's alarm(1) ends its select/pselect/poll/ppoll/epoll_wait (20 s timeout) with
    EINTR while the parent sleeps in a wait of its own or spins (issue 15: the SIGALRM came only at
    the child's timeout). The guest's bounds (10 s, 30 s) are hang guards, as is the run's 240 s."""
    guest_c.check("procs", "child_alarm", parent, timeout=240.0)


def test_process_limit_default_and_setting() -> None:
    # 1 GiB: every process is charged its whole memory (8 MiB of stack and the program) to the
    # sandbox's one memory budget, and 64 of them must fit in it to meet the process limit first
    result = guest_c.check("procs", "limit", "64", mem=1 << 30)
    assert "made 63" in result.out
    with guest_c.boot("procs", "limit", "5") as sb:
        sb.set_max_processes(5)
        result = guest_c.drive(sb)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert "made 4" in result.out
    with guest_c.boot("procs", "limit") as sb, pytest.raises(ValueError):
        sb.set_max_processes(0)


def _run_until_forked(sb: Guest, n: int) -> None:
    """Run `leave N` until its children exist and it blocks."""
    out = b""
    deadline = time.monotonic() + 30
    while f"forked {n}".encode() not in out:
        ev = sb.run(deadline)
        assert ev.kind is EventKind.OUTPUT, ev
        out += ev.data
    ev = sb.run(time.monotonic() + 0.5)  # the first process blocks on a pipe nobody writes
    assert ev.kind is EventKind.TIMEOUT, ev


def test_children_are_freed_with_their_family() -> None:
    base = Guest.child_processes_alive()
    with guest_c.boot("procs", "leave", "3") as sb:
        _run_until_forked(sb, 3)
        assert sb.process_count() == 4
        assert Guest.child_processes_alive() == base + 3
    assert Guest.child_processes_alive() == base  # freeing process 1 freed them
    # process 1 exiting takes them too, at once
    with guest_c.boot("procs", "leave", "2", "exit") as sb:
        result = guest_c.drive(sb)
        assert result.kind is EventKind.EXIT and "forked 2" in result.out, result.describe()
        assert Guest.child_processes_alive() == base
        assert sb.process_count() == 1


def test_snapshot_refuses_children_and_restore_ends_them() -> None:
    base = Guest.child_processes_alive()
    with guest_c.boot("procs", "leave", "2") as sb:
        snap = sb.snapshot()
        _run_until_forked(sb, 2)
        assert sb.process_count() == 3
        with pytest.raises(Exception, match="child processes"):
            sb.snapshot()
        sb.restore(snap)  # a rollback: the children are gone, process 1 is as it was
        assert sb.process_count() == 1
        assert Guest.child_processes_alive() == base


SYSCALL_ENTRY = 32  # Guest.test_break_in_trap: a syscall that has reached the entry's `out`
SIGINT = 2


@pytest.mark.parametrize("mode", ["parent", "child", "trap"])
def test_stop_in_user_code_resumes_from_the_vcpu(mode: str) -> None:
    """Runs that stop in user code (the deadline, here: deterministic, as a kick is) or inside a
    syscall's trap leave the process's registers in the vCPU only. With children on a second
    executor VM, process 1 stays attached to its own while others run; it (or a child, on the
    children's executor) must resume from the vCPU, not from its last syscall's registers (issue 15:
    reloading those crashed the agent with SIGILL after an interrupted `!echo started; sleep 100`).
    Then SIGINT, as an interrupt raises it, ends the guest's spin through its handler."""
    engine = Engine.default()
    # the trap's getppid must reach the entry's `out`: no syscall site rewritten into an exit of its own
    engine.set_syscall_path(site_rewrite=mode != "trap")
    try:
        _stop_in_user_code(mode)
    finally:
        engine.set_syscall_path()


def _stop_in_user_code(mode: str) -> None:
    with guest_c.boot("procs", "stopped_in_user_code", mode) as sb:
        out = b""
        deadline = time.monotonic() + 60
        while b"spinning\n" not in out:
            ev = sb.run(deadline)
            assert ev.kind is EventKind.OUTPUT, (ev, out)
            out += ev.data
        if mode == "trap":
            sb.test_break_in_trap(SYSCALL_ENTRY)
            ev = sb.run(time.monotonic() + 60)
            assert ev.kind is EventKind.KICK, ev  # stopped inside getppid's trap
        for _ in range(3):  # it spins: each run ends at its deadline, in user code
            ev = sb.run(time.monotonic() + 0.05)
            assert ev.kind is EventKind.TIMEOUT, ev
        sb.raise_signal(SIGINT)
        result = guest_c.drive(sb)
    result.stdout = out + result.stdout
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert "PASS stopped_in_user_code" in result.out, result.describe()
