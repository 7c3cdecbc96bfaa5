"""Sockets (socketpair streams, no network) and epoll of a guest with no CPython
(guest_programs/sockets.c), and their state across snapshots, saved templates and forks; named
AF_UNIX stream sockets (guest_programs/unix_sockets.c), fds passed over them with SCM_RIGHTS
(guest_programs/fd_passing.c) and TCP on the sandbox's own loopback (guest_programs/loopback.c),
in the guest and on Linux."""
from __future__ import annotations

import time

import pytest

import guest_c
from zeroboot_kernel.errors import SandboxError
from zeroboot_kernel.native import EventKind


def test_socketpair_streams():
    guest_c.check("sockets", "pair")


def test_network_sockets_are_refused_and_bad_arguments_fail():
    guest_c.check("sockets", "refused")


def test_epoll():
    guest_c.check("sockets", "epoll")


def test_queued_bytes_and_epoll_items_survive_snapshots_saves_and_forks(tmp_path):
    guest_c.check_state_survives_snapshots("sockets", tmp_path)  # forks share no streams


UNIX_TESTS = ["path", "backlog", "abstract", "two_processes"]


@pytest.mark.parametrize("test", UNIX_TESTS)
def test_named_unix_sockets(test: str) -> None:
    guest_c.check("unix_sockets", test)


@pytest.mark.parametrize("test", UNIX_TESTS)
def test_the_named_socket_program_passes_on_linux(test: str) -> None:
    """The checks are Linux's behaviour, not the engine's: the same binary passes on the host."""
    guest_c.check_on_linux("unix_sockets", test)


LOOPBACK_TESTS = ["tcp4", "ports", "tcp6", "two_processes"]


@pytest.mark.parametrize("test", [*LOOPBACK_TESTS, "unreachable"])
def test_tcp_on_the_sandboxs_loopback(test: str) -> None:
    guest_c.check("loopback", test)


@pytest.mark.parametrize("test", LOOPBACK_TESTS)
def test_the_loopback_program_passes_on_linux(test: str) -> None:
    """The same binary on the host: its checks are Linux's behaviour."""
    guest_c.check_on_linux("loopback", test)


FD_PASSING_TESTS = ["pair", "named", "boundaries", "truncated", "errors", "sender_exits", "kinds", "cycle"]


@pytest.mark.parametrize("test", [*FD_PASSING_TESTS, "inflight_limit"])
def test_fd_passing(test: str) -> None:
    guest_c.check("fd_passing", test)


@pytest.mark.parametrize("test", FD_PASSING_TESTS)
def test_the_fd_passing_program_passes_on_linux(test: str) -> None:
    """The same binary on the host: its checks are Linux's behaviour ("inflight_limit" is the
    sandbox's own bound; root has none on Linux)."""
    guest_c.check_on_linux("fd_passing", test)


def test_cycles_live_until_the_sandbox_ends() -> None:
    """Sockets in flight on their own streams with every fd closed: no garbage collector, so they
    stay in flight (counted) until the sandbox goes, which frees them (ASan builds: no leak)."""
    with guest_c.boot("fd_passing", "cycle") as sb:
        result = guest_c.drive(sb)
        assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
        assert sb.fds_in_flight() == 3


def test_a_snapshot_with_fds_in_flight_is_refused() -> None:
    with guest_c.boot("fd_passing", "snapshot") as sb:
        ev = sb.run(time.monotonic() + 10)
        assert ev.kind is EventKind.OUTPUT and b"ready: in flight" in ev.data, ev
        assert sb.run(time.monotonic() + 10).kind is EventKind.INPUT
        assert sb.fds_in_flight() == 1
        with pytest.raises(SandboxError, match="1 file descriptor in flight on its AF_UNIX sockets"):
            sb.snapshot()
        sb.push_input(b"g")
        ev = sb.run(time.monotonic() + 10)
        assert ev.kind is EventKind.OUTPUT and b"ready: received" in ev.data, ev
        assert sb.run(time.monotonic() + 10).kind is EventKind.INPUT
        assert sb.fds_in_flight() == 0
        sb.snapshot().release()
        sb.push_input(b"g")
        result = guest_c.drive(sb)
        assert result.kind is EventKind.EXIT and result.status == 0 and "PASS snapshot" in result.out, result.describe()
