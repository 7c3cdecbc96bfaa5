"""Time, entropy, identity, futexes, clone and signals of a guest with no CPython
(guest_programs/process.c and signals.c)."""
from __future__ import annotations

import threading
import time

import pytest

import guest_c
from zeroboot_kernel.native import EventKind
from zeroboot_kernel.errors import SandboxError


def test_clock_gettime_vdso_and_syscall_agree_with_the_host():
    result = guest_c.check("process", "clock")
    guest_now = float(result.out.split("realtime ")[1].split()[0])
    assert abs(guest_now - time.time()) < 1.0


def test_nanosleep_sleeps():
    result = guest_c.check("process", "sleep")
    assert int(result.out.split("slept ")[1].split()[0]) >= 100_000_000


def test_waiting_is_not_cpu_time():
    """A sleep, a poll's timeout and a futex wait cost no CPU time (CPU clocks, getrusage), as on
    Linux; a busy loop does. Before, the engine counted its own waits for the guest as the guest's
    system time, so `%time time.sleep(1)` said `sys: 1 s`."""
    guest_c.check_on_linux("process", "cpu_time")
    guest_c.check("process", "cpu_time")


def test_getrandom_differs_between_runs():
    first = guest_c.check("process", "random").out
    second = guest_c.check("process", "random").out
    assert first.split("random ")[1] != second.split("random ")[1]


def test_identity_uname_pid_uid_limits():
    guest_c.check("process", "identity")


def test_futex_wait_times_out():
    guest_c.check("process", "futex")


def test_clone_flag_checks_and_threads_work():
    guest_c.check("process", "clone")


def test_signals_the_guest_sends_itself():
    guest_c.check("signals", "self")


def test_sigwait_and_sigtimedwait_take_pending_signals():
    guest_c.check("signals", "sigtimedwait")


def test_faults_the_guest_handles_itself():
    guest_c.check("signals", "segv_handler")


def _run_until_output(sb, text: str) -> None:
    ev = sb.run(time.monotonic() + 10)
    assert ev.kind is EventKind.OUTPUT and text.encode() in ev.data, ev


@pytest.mark.parametrize("test, announce", [("sigint_sleep", "sleeping"), ("sigint_busy", "looping")])
def test_host_sigint_runs_the_guest_handler(test, announce):
    """The host pauses the guest (deadline) in nanosleep or in a busy loop, raises SIGINT, and the
    guest's sigaction handler runs; an interrupted nanosleep fails with EINTR; the program goes on."""
    with guest_c.boot("signals", test) as sb:
        _run_until_output(sb, announce)
        assert sb.run(time.monotonic() + 0.3).kind is EventKind.TIMEOUT
        sb.raise_signal(2)
        result = guest_c.drive(sb)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert f"PASS {test}" in result.out


def test_host_sigint_after_a_kick_ends_pause():
    """The kernel's way: another thread kicks the running sandbox, then SIGINT is raised."""
    with guest_c.boot("signals", "sigint_pause") as sb:
        _run_until_output(sb, "pausing")
        timer = threading.Timer(0.2, sb.kick)
        timer.start()
        ev = sb.run(time.monotonic() + 10)
        timer.join()
        assert ev.kind is EventKind.KICK
        sb.raise_signal(2)
        result = guest_c.drive(sb)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()


def test_host_signal_without_a_guest_handler_is_refused():
    with guest_c.boot("signals", "no_handler") as sb:
        _run_until_output(sb, "sleeping")
        with pytest.raises(SandboxError, match="no handler for signal 2"):
            sb.raise_signal(2)
        result = guest_c.drive(sb)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()


def test_alarm_interrupts_a_sleep():
    result = guest_c.check("signals", "alarm_sleep")
    assert 950 <= int(result.out.split("alarm after ")[1].split()[0]) < 3000


def test_periodic_itimer_interrupts_a_busy_loop():
    guest_c.check("signals", "itimer_busy")


def test_alarm_with_default_action_kills_and_ignored_alarm_does_not():
    killed = guest_c.run("signals", "alarm_default")
    assert killed.kind is EventKind.FAULT and killed.end.signal == 14, killed.describe()
    guest_c.check("signals", "alarm_default", "ignored")


def test_cpu_time_itimers_count_cpu_time_not_sleep():
    guest_c.check_on_linux("signals", "itimer_cpu")
    guest_c.check("signals", "itimer_cpu")


def test_registers_and_flags_survive_signal_delivery():
    guest_c.check("signals", "regs_survive_signals")


def test_clock_never_jumps_when_the_host_stops_the_guest_often():
    """Each stop is a timeout, a SIGINT and a resume, which rewrites the vDSO's data page."""
    with guest_c.boot("signals", "clock_across_stops") as sb:
        _run_until_output(sb, "reading the clock")
        for _ in range(10):
            assert sb.run(time.monotonic() + 0.03).kind is EventKind.TIMEOUT
            sb.raise_signal(2)
        result = guest_c.drive(sb)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
