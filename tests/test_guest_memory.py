"""Memory syscalls of a guest with no CPython: bad pointers, ENOSYS, mmap/brk/mremap, exhaustion
(guest_programs/mem.c, 256 MiB guest)."""
from __future__ import annotations

import logging

import pytest

import guest_c


def test_bad_pointers_fail_with_efault():
    """Unmapped, supervisor (low 2 MiB), NULL, beyond guest memory, overlong and wrapping lengths."""
    guest_c.check("mem", "efault")


def test_unknown_syscalls_fail_with_enosys_and_are_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="zeroboot_kernel.native"):
        guest_c.check("mem", "enosys")
    lines = [r.getMessage() for r in caplog.records if "unimplemented syscall" in r.getMessage()]
    for needle in ("unknown (423)", "io_uring_setup (425)", "unknown (100000)"):
        assert sum(needle in line for line in lines) == 1, lines  # each called twice, logged once


def test_mmap_until_enomem_then_reuse():
    result = guest_c.check("mem", "exhaust")
    assert "chunks " in result.out


def test_freed_memory_reads_zero_when_handed_out_again():
    """Big freed ranges stay mapped for reuse (zb_mem_free_for_reuse): each way of freeing and
    taking back memory must still give zeros."""
    guest_c.check("mem", "reuse_reads_zero")


def test_brk_grows_and_shrinks():
    guest_c.check("mem", "brk")


def test_mremap_grows_in_place_moves_and_shrinks():
    guest_c.check("mem", "mremap")


def test_map_fixed_and_noreplace():
    guest_c.check("mem", "map_fixed")


@pytest.mark.parametrize("test", ["mmap_host_file", "mmap_overlay_file"])
def test_file_backed_mmap(test):
    guest_c.check("mem", test)
