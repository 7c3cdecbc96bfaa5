"""File syscalls of a guest with no CPython, on the overlay (/tmp) and the read-only view
(guest_programs/files.c)."""
from __future__ import annotations

import os

import guest_c


def test_read_write_seek_pread_readv_truncate():
    guest_c.check("files", "rw")


def test_dup_dup2_dup3_fcntl_and_emfile():
    guest_c.check("files", "fds")


def test_pipes():
    guest_c.check("files", "pipe")


def test_getdents64_of_overlay_view_and_root():
    result = guest_c.check("files", "getdents")
    root = {line.split(": ", 1)[1] for line in result.out.splitlines() if line.startswith("root: ")}
    top = str(guest_c.BIN_DIR).split("/")[1]  # the view's top-level directory
    assert root == {".", "..", "dev", "proc", "tmp", "home", "etc", top}


def test_stat_statx_readlink_access_cwd():
    result = guest_c.check("files", "stat")
    fields = dict(zip(*[iter(result.out.split("\n")[0].split())] * 2))
    host = os.stat(guest_c.build("files"))
    assert int(fields["size"]) == host.st_size
    assert int(fields["mtime"]) == int(host.st_mtime)


def test_mkdir_unlink_rename_symlink_in_overlay():
    guest_c.check("files", "namespace")


def test_writing_into_the_view_is_erofs():
    before = sorted(os.listdir(guest_c.BIN_DIR))
    guest_c.check("files", "erofs")
    assert sorted(os.listdir(guest_c.BIN_DIR)) == before


def test_links_owners_xattrs_times_tmpfile():
    guest_c.check("files", "metadata")
