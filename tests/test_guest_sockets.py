"""Sockets (socketpair streams, no network) and epoll of a guest with no CPython
(guest_programs/sockets.c), and their state across snapshots, saved templates and forks."""
from __future__ import annotations

import time

import guest_c
from zeroboot_kernel.native import EventKind, Snapshot


def test_socketpair_streams():
    guest_c.check("sockets", "pair")


def test_network_sockets_are_refused_and_bad_arguments_fail():
    guest_c.check("sockets", "refused")


def test_epoll():
    guest_c.check("sockets", "epoll")


def test_queued_bytes_and_epoll_items_survive_snapshots_saves_and_forks(tmp_path):
    with guest_c.boot("sockets", "snapshot_state") as sb:
        ev = sb.run(time.monotonic() + 10)
        assert ev.kind is EventKind.OUTPUT and b"ready" in ev.data, ev
        assert sb.run(time.monotonic() + 10).kind is EventKind.INPUT
        snap = sb.snapshot()
        (tmp_path / "saved").mkdir()
        snap.save(str(tmp_path / "saved"))
        loaded = Snapshot.load(str(tmp_path / "saved"))
        for source in (snap, snap, loaded):  # two forks of one snapshot do not share the streams
            with source.fork() as child:
                child.push_input(b"go")
                result = guest_c.drive(child)
            assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
            assert "PASS snapshot_state" in result.out
