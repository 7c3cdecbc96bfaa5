"""A host signal (the kick, the deadline timer, the caller's) can stop KVM_RUN while a `syscall` is
still on its way to the host: the vCPU sits in the syscall entry (LSTAR) before its `out`, not in
user code. A signal raised then must not be delivered over that state (with the earlier
page-fault trap the handler's sigreturn resumed at LSTAR or in the stub and the guest died with
SIGSEGV at 0x7f0000000000, as the syscall walk did under host load); the engine finishes the trap,
serves the syscall, then delivers.
The stop is forced at that exact point with a hardware breakpoint on the stub (a test hook), so
the test does not depend on timing."""
from __future__ import annotations

import time

import battery
from zeroboot_kernel.native import EventKind

SYSCALL_ENTRY = 32  # ZB_BREAK_SYSCALL_ENTRY: the entry every `syscall` arrives at
SIGUSR1 = 10


def test_signal_raised_while_a_syscall_trap_is_under_way():
    with battery.boot("trap_signal") as sb:
        out = b""
        while b"READY\n" not in out:
            ev = sb.run(time.monotonic() + 60)
            assert ev.kind is EventKind.OUTPUT, ev
            out += ev.data
        sb.test_break_in_trap(SYSCALL_ENTRY)
        ev = sb.run(time.monotonic() + 60)
        assert ev.kind is EventKind.KICK, ev  # stopped inside getppid's trap
        sb.raise_signal(SIGUSR1)
        while True:
            ev = sb.run(time.monotonic() + 60)
            if ev.kind is not EventKind.OUTPUT:
                break
            out += ev.data
        assert ev.kind is EventKind.EXIT and ev.status == 0, (ev, out)
        assert b"ppid=0 handled=1\n" in out, out
    battery.engine_still_works()
