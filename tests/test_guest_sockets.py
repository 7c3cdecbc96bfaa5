"""Sockets (socketpair streams, no network) and epoll of a guest with no CPython
(guest_programs/sockets.c), and their state across snapshots, saved templates and forks; named
AF_UNIX stream sockets (guest_programs/unix_sockets.c), in the guest and on Linux."""
from __future__ import annotations

import subprocess

import pytest

import guest_c


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
    binary = guest_c.build("unix_sockets")
    proc = subprocess.run([str(binary), test], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and f"PASS {test}" in proc.stdout, proc.stderr
