"""Guest threads (issue 14): the thread syscalls of a guest with no CPython
(guest_programs/threads.c), checked in the sandbox and, for the same binary, on the host's Linux;
a deadlock of every thread still honours the run's deadline; threads survive snapshots, saved
templates and forks."""
from __future__ import annotations

import time

import pytest

import guest_c
from zeroboot_kernel.native import EventKind

TESTS = ["create_join", "cleartid", "futex", "signals", "preempt"]


@pytest.mark.parametrize("test", [*TESTS, "refusals"])
def test_thread_syscalls(test: str) -> None:
    guest_c.check("threads", test)


@pytest.mark.parametrize("test", [*TESTS, "exit_group"])
def test_same_program_passes_on_linux(test: str) -> None:
    """The checks are Linux's behaviour, not the engine's: the same binary passes on the host."""
    guest_c.check_on_linux("threads", test)


def test_exit_group_from_a_thread_ends_all_threads() -> None:
    result = guest_c.run("threads", "exit_group")
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert "PASS exit_group" in result.out


def test_deadlock_of_all_threads_is_the_cell_blocking_not_an_engine_hang() -> None:
    """Every thread waits forever: the run still ends at its deadline (a timeout the session
    rolls back), and a kick ends it too."""
    with guest_c.boot("threads", "deadlock") as sb:
        ev = sb.run(time.monotonic() + 10)
        assert ev.kind is EventKind.OUTPUT and b"blocking" in ev.data, ev
        ev = sb.run(time.monotonic() + 0.3)
        assert ev.kind is EventKind.TIMEOUT, ev
        sb.kick()
        ev = sb.run(time.monotonic() + 10)
        assert ev.kind is EventKind.KICK, ev


def test_threads_survive_snapshots_saves_and_forks(tmp_path) -> None:
    guest_c.check_state_survives_snapshots("threads", tmp_path)


def test_thread_limit_is_eagain_past_the_setting() -> None:
    with guest_c.boot("threads", "limit", "5") as sb:
        sb.set_max_threads(5)
        with pytest.raises(ValueError):
            sb.set_max_threads(0)
        result = guest_c.drive(sb)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert "PASS limit" in result.out
