"""Sockets (socketpair streams, no network) and epoll of a guest with no CPython
(guest_programs/sockets.c), and their state across snapshots, saved templates and forks."""
from __future__ import annotations


import guest_c


def test_socketpair_streams():
    guest_c.check("sockets", "pair")


def test_network_sockets_are_refused_and_bad_arguments_fail():
    guest_c.check("sockets", "refused")


def test_epoll():
    guest_c.check("sockets", "epoll")


def test_queued_bytes_and_epoll_items_survive_snapshots_saves_and_forks(tmp_path):
    guest_c.check_state_survives_snapshots("sockets", tmp_path)  # forks share no streams
