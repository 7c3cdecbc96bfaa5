"""Writable shared file mappings of overlay files (issue 13 item 6): the syscalls of a guest with
no CPython (guest_programs/shared_map.c), the mapping and the file across snapshots, saved
templates and forks, and numpy's memmap and sqlite's WAL mode in a notebook session, across cells
and a rewind."""
from __future__ import annotations

import time

import pytest

import guest_c
from zeroboot_kernel.native import EventKind
from session_helpers import cell
from zeroboot_kernel.session import Session


@pytest.mark.parametrize("test", ["through_mapping", "write_then_map", "writeback", "truncate", "overlap",
                                  "alias", "limits", "host_file"])
def test_shared_map_syscalls(test: str) -> None:
    guest_c.check("shared_map", test)


def test_mapping_and_file_survive_snapshots_saves_and_forks(tmp_path) -> None:
    guest_c.check_state_survives_snapshots("shared_map", tmp_path)  # forks share no mapping


def test_host_reads_see_the_mapping() -> None:
    """The host side's reads of a guest file (%sandbox export) see bytes stored only through a
    shared mapping, and do not disturb the guest's coherence checks afterwards."""
    with guest_c.boot("shared_map", "snapshot_state") as sb:
        ev = sb.run(time.monotonic() + 10)
        assert ev.kind is EventKind.OUTPUT and b"ready" in ev.data, ev
        assert sb.run(time.monotonic() + 10).kind is EventKind.INPUT
        assert sb.read_chunk("/tmp/shm-s", 0, 13) == b"mapped before"
        assert sb.read_chunk("/tmp/shm-s", 4096, 14) == b"written before"
        sb.push_input(b"go")
        result = guest_c.drive(sb)
        assert result.kind is EventKind.EXIT and result.status == 0, result.describe()


MEMMAP = ("import numpy as np, os\n"
          "mm = np.memmap('{path}', dtype='float64', mode='w+', shape=(1000,))\n"
          "mm[:] = np.arange(1000)\nmm.flush()\ndel mm\n"
          "rp = np.memmap('{path}', dtype='float64', mode='r+', shape=(1000,))\n"
          "rp[::2] *= -1\n"
          "print(float(np.fromfile('{path}').sum()), float(rp.sum()), os.path.getsize('{path}'))")


@pytest.mark.parametrize("files,path", [("overlay", "mm.dat"), ("overlay", "/tmp/mm.dat"),
                                        ("readwrite", "/home/sandbox/mm.dat")])
def test_numpy_memmap_write_modes(template, tmp_path, files: str, path: str) -> None:
    s = Session(template, project_dir=str(tmp_path), files=files, environ={})
    try:
        # np.fromfile reads while r+ is still mapped (and unflushed): it sees the mapping's bytes
        r = cell(s, MEMMAP.format(path=path), 1)
        assert r["status"] == "ok" and r["stdout"].split() == ["500.0", "500.0", "8000"], r
        r = cell(s, "rp[0] = 1e6\nprint(float(np.fromfile('{path}')[0]))".format(path=path), 2)
        assert r["status"] == "ok" and r["stdout"].strip() == "1000000.0", r
    finally:
        s.close()
    if files == "overlay" and not path.startswith("/"):
        assert not (tmp_path / path).exists()  # an overlay file: the host folder is untouched


def test_sqlite_wal_inserts_and_select(template, tmp_path) -> None:
    s = Session(template, project_dir=str(tmp_path), environ={})
    try:
        for n, path in enumerate(["wal.db", "/tmp/wal.db"], start=1):
            r = cell(s, "import sqlite3\n"
                        f"con = sqlite3.connect('{path}')\n"
                        "print(con.execute('PRAGMA journal_mode=wal').fetchone()[0])\n"
                        "con.execute('create table t (x)')\n"
                        "for i in range(200):\n    con.execute('insert into t values (?)', (i,))\n"
                        "con.commit()\n"
                        f"other = sqlite3.connect('{path}')\n"  # a second connection reads through the -shm index
                        "print(other.execute('select count(*), sum(x) from t').fetchone())\n"
                        "other.close(); con.close()", n)
            assert r["status"] == "ok" and r["stdout"].split("\n")[:2] == ["wal", "(200, 19900)"], r
    finally:
        s.close()


def test_rewind_restores_file_and_mapping_together(template, tmp_path) -> None:
    s = Session(template, project_dir=str(tmp_path), environ={})
    try:
        r = cell(s, "import numpy as np, sqlite3\n"
                    "mm = np.memmap('/tmp/r.dat', dtype='int64', mode='w+', shape=(512,))\nmm[:] = 1\n"
                    "con = sqlite3.connect('/tmp/r.db')\ncon.execute('PRAGMA journal_mode=wal')\n"
                    "con.execute('create table t (x)')\ncon.execute('insert into t values (1)')\ncon.commit()\n"
                    "print('set')", 1)
        assert r["status"] == "ok", r
        r = cell(s, "mm[:] = 7\ncon.execute('insert into t values (2)')\ncon.commit()\n"
                    "print(int(np.fromfile('/tmp/r.dat', dtype='int64').sum()))", 2)
        assert r["status"] == "ok" and r["stdout"].strip() == "3584", r
        s.rewind(1)  # back to the state after cell 1: the mapping and the file both hold ones
        r = cell(s, "print(int(mm.sum()), int(np.fromfile('/tmp/r.dat', dtype='int64').sum()),\n"
                    "      con.execute('select count(*) from t').fetchone()[0])\n"
                    "mm[0] = 100\nprint(int(np.fromfile('/tmp/r.dat', dtype='int64')[0]))", 3)
        assert r["status"] == "ok" and r["stdout"].split() == ["512", "512", "1", "100"], r
    finally:
        s.close()
