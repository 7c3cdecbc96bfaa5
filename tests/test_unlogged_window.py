"""The unlogged window (issue 23): big anonymous mappings live in a KVM memslot without dirty
logging, backed by huge pages, and what changed there is found from the host's page tables
(native/memory.h). Checked here: that big arrays land there, and that every snapshot, restore,
rollback and fork of a sandbox that wrote into the window (in place, through munmap, mremap and
madvise(MADV_DONTNEED), and into memory it had unmapped) gives back exactly what was there, byte
for byte (sha256 of the whole range), in forks of forks too."""
from __future__ import annotations

import pytest

from zeroboot_kernel.native import unlogged_window
from zeroboot_kernel.sandbox import Sandbox

MIB = 1 << 20
WINDOW_LO = 256 * MIB                 # memory.h: the window starts above the first 256 MiB ...
WINDOW_TOP = 640 * MIB                # ... and ends at least 640 MiB below the top of guest memory

SETUP = """
import ctypes, hashlib, mmap, os, numpy as np
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
MIB = 1 << 20
def digest(addr, size):
    return hashlib.sha256(ctypes.string_at(addr, size)).hexdigest()
def anon(size):
    p = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert p not in (None, ctypes.c_void_p(-1).value)
    return p
a = np.arange(16 * MIB // 8, dtype=np.uint64) * 2654435761    # 16 MiB, every page distinct
b = anon(24 * MIB)
ctypes.memset(b, 0x5a, 24 * MIB)
state = lambda: (digest(a.ctypes.data, a.nbytes), digest(b, 24 * MIB))
"""


def out(sb, code: str) -> str:
    r = sb.execute(code)
    assert r.status == "ok", r.stderr
    return r.stdout.strip()


def window_of(template) -> tuple[int, int]:
    size = int(template.manifest["memory"])
    return WINDOW_LO, size - max(size // 8, WINDOW_TOP)


def test_big_mappings_go_to_the_window_and_small_ones_do_not(template) -> None:
    lo, hi = window_of(template)
    with template.fork() as sb:
        out(sb, SETUP)
        addrs = out(sb, "small = np.ones(1000)\nprint(a.ctypes.data, b, small.ctypes.data)").split()
        big_a, big_b, small = (int(x) for x in addrs)
        assert lo <= big_a < hi and lo <= big_b < hi
        assert big_b % (2 * MIB) == 0       # 2 MiB aligned: one host huge page per guest huge page
        assert not lo <= small < hi


def test_libraries_stacks_reservations_and_files_stay_out_of_the_window(template) -> None:
    """Only data goes to the window: a library image, a thread stack, an arena reservation or a file
    mapping there is written (or compared) at every snapshot and keeps its part unlogged, so every
    populated page of the part would be compared at every snapshot and fork (memory.h)."""
    lo, hi = window_of(template)
    with template.fork() as sb:
        out(sb, SETUP)
        shown = out(sb, "\n".join([
            "import threading",
            "libc.pthread_self.restype = ctypes.c_void_p",
            "tops = []",   # glibc keeps a thread's descriptor at the top of its stack mapping
            "t = threading.Thread(target=lambda: tops.append(libc.pthread_self())); t.start(); t.join()",
            "flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS",
            "rw = mmap.PROT_READ | mmap.PROT_WRITE",     # (Python 3.11's mmap lacks the other names)
            "arena = libc.mmap(None, 64 * MIB, 0, flags, -1, 0)",                  # PROT_NONE
            "noreserve = libc.mmap(None, 64 * MIB, rw, flags | 0x4000, -1, 0)",   # MAP_NORESERVE
            "stack = libc.mmap(None, 8 * MIB, rw, flags | 0x20000, -1, 0)",       # MAP_STACK
            "with open('/tmp/big.bin', 'wb') as f: f.truncate(8 * MIB)",
            "fd = os.open('/tmp/big.bin', os.O_RDWR)",
            "fmap = libc.mmap(None, 8 * MIB, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)",
            "libs = [int(l.split('-')[0], 16) for l in open('/proc/self/maps') if '.so' in l]",
            "print(tops[0], arena, noreserve, stack, fmap, len(libs), *libs)"]))
        top, arena, noreserve, stack, fmap, nlibs, *libs = (int(x) for x in shown.split())
        assert nlibs > 10 and len(libs) == nlibs       # libpython, numpy's, OpenBLAS, ...
        for what, at in [("thread stack", top), ("PROT_NONE", arena), ("MAP_NORESERVE", noreserve),
                         ("MAP_STACK", stack), ("file", fmap)]:
            assert not lo <= at < hi, f"{what} at {at:#x} is in the window [{lo:#x}, {hi:#x})"
        inside = [hex(a) for a in libs if lo <= a < hi]
        assert not inside, f"library mappings in the window: {inside}"


def test_restore_after_writes_munmap_mremap_and_madvise_gives_back_every_byte(template) -> None:
    with template.fork() as sb:
        out(sb, SETUP)
        before = out(sb, "print(state())")
        snap = sb.snapshot()
        freed = int(out(sb, "print(b)"))
        out(sb, "\n".join([
            "a[::4096] += 1",                                   # one word in every other page
            "a[-1] = 0",
            "libc.madvise(b + 4 * MIB, 4 * MIB, 4)",            # MADV_DONTNEED: reads zeros
            "nb = libc.mremap(b, 24 * MIB, 40 * MIB, 1)",      # MREMAP_MAYMOVE: grows, may move
            "ctypes.memset(nb + 24 * MIB, 0x33, 16 * MIB)",
            "libc.munmap(nb, 40 * MIB)",
            # hostile: the guest writes into window memory it no longer maps (all memory is mapped
            # in its page tables); after the restore that memory must be what the snapshot had
            f"ctypes.memset({freed} + MIB, 0x77, 2 * MIB)",
        ]))
        assert out(sb, "print(state())") != before
        sb.restore(snap)
        assert out(sb, "print(state())") == before
        # again after a second round of changes, from the same snapshot
        out(sb, "a[:] = 7\nctypes.memset(b, 1, 24 * MIB)")
        sb.restore(snap)
        assert out(sb, "print(state())") == before
        # memory freed after the restore and handed out again reads as zeros
        out(sb, "libc.munmap(b, 24 * MIB)")
        assert out(sb, "c = anon(24 * MIB)\nprint(ctypes.string_at(c, 24 * MIB).count(0))") == str(24 * MIB)
        snap.release()


def test_snapshots_of_window_pages_fork_exactly_down_to_a_fork_of_a_fork(template) -> None:
    with template.fork() as sb:
        out(sb, SETUP)
        first = out(sb, "print(state())")
        s1 = sb.snapshot()
        out(sb, "a[1000:3000] = 5\nctypes.memset(b + 3 * MIB, 9, 5 * MIB)")
        second = out(sb, "print(state())")
        s2 = sb.snapshot()
        assert first != second
        with Sandbox(s1.fork(), template, False) as child:
            assert out(child, "print(state())") == first
            out(child, "a[:10] = 1\nctypes.memset(b, 2, MIB)")
            third = out(child, "print(state())")
            s3 = child.snapshot()
            with Sandbox(s3.fork(), template, False) as grandchild:
                assert out(grandchild, "print(state())") == third
                out(grandchild, "a[:] = 0")
            assert out(child, "print(state())") == third
            s3.release()
        with Sandbox(s2.fork(), template, False) as other:
            assert out(other, "print(state())") == second
        # the original went on from s2 and is unaffected by its forks
        assert out(sb, "print(state())") == second
        sb.restore(s1)
        assert out(sb, "print(state())") == first
        s1.release()
        s2.release()


@pytest.mark.parametrize("on", [False, True])
def test_memory_made_with_and_without_the_window_restores_the_same(template, on: bool) -> None:
    was = unlogged_window(on)
    try:
        with template.fork() as sb:
            out(sb, SETUP)
            before = out(sb, "print(state())")
            lo, hi = window_of(template)
            where = int(out(sb, "print(a.ctypes.data)"))
            snap = sb.snapshot()
            out(sb, "a[::512] = 3\nctypes.memset(b, 0, 24 * MIB)")
            sb.restore(snap)
            assert out(sb, "print(state())") == before
            snap.release()
    finally:
        unlogged_window(was)
    assert (lo <= where < hi) == on     # without the window, the allocator is what it was


def test_a_window_part_that_holds_still_is_logged_and_restores_exactly(template) -> None:
    with template.fork() as sb:
        out(sb, SETUP)
        before = out(sb, "print(state())")
        assert sb.guest.window_logged_bytes() == 0       # just filled: unlogged
        snaps = [sb.snapshot() for _ in range(3)]         # nothing changes between them
        logged = sb.guest.window_logged_bytes()
        assert logged > 0                                 # the part holding a and b held still
        # writes into a logged part are in KVM's log: the next snapshot has them, a restore undoes them
        out(sb, "a[12345] = 1\nctypes.memset(b + 5 * MIB, 3, 4096)\nctypes.memset(b + 17 * MIB + 8, 4, 8)")
        changed = out(sb, "print(state())")
        assert changed != before
        after = sb.snapshot()
        sb.restore(snaps[-1])
        assert out(sb, "print(state())") == before
        sb.restore(after)
        assert out(sb, "print(state())") == changed
        with Sandbox(after.fork(), template, False) as child:
            assert out(child, "print(state())") == changed
        # a big mapping made in a logged part makes it unlogged again (fast first touch) ...
        out(sb, f"c = np.ones({64 * MIB // 8})")
        assert sb.guest.window_logged_bytes() < logged
        # ... and what the part held stays exact across snapshots and restores
        with_c = out(sb, "print(state(), c.sum())")
        s_c = sb.snapshot()
        out(sb, "a[:] = 9\nc[:] = 0")
        sb.restore(s_c)
        assert out(sb, "print(state(), c.sum())") == with_c
        for s in [*snaps, after, s_c]:
            s.release()


def test_mappings_across_the_window_edges_restore_exactly(template) -> None:
    """A guest picks its own addresses (MAP_FIXED_NOREPLACE): mappings straddling each edge of the
    window span a dirty-logged memslot and an unlogged one; both halves must come back exactly."""
    lo, hi = window_of(template)
    with template.fork() as sb:
        prelude = SETUP.split("MIB = 1 << 20")[0] + "MIB = 1 << 20\n"   # before SETUP's arrays take the window's top
        code = prelude + "\n".join([
            "spots = []",
            f"for at in ({lo - 4 * MIB}, {hi - 4 * MIB}):",
            "    p = libc.mmap(at, 8 * MIB, mmap.PROT_READ | mmap.PROT_WRITE,"
            " mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x100000, -1, 0)",   # MAP_FIXED_NOREPLACE
            "    if p == at:",
            "        ctypes.memmove(p, bytes(range(256)) * (8 * MIB // 256), 8 * MIB)",
            "        spots.append(p)",
            "edges = lambda: [digest(p, 8 * MIB) for p in spots]",
            "print(len(spots))",
        ])
        assert int(out(sb, code)) >= 1, "neither edge of the window was free"   # the upper one may be taken
        out(sb, SETUP)
        before = out(sb, "print(edges(), state())")
        snap = sb.snapshot()
        out(sb, "for p in spots: ctypes.memset(p + 3 * MIB, 0xee, 2 * MIB)")
        assert out(sb, "print(edges(), state())") != before
        sb.restore(snap)
        assert out(sb, "print(edges(), state())") == before
        with Sandbox(snap.fork(), template, False) as child:
            assert out(child, "print(edges(), state())") == before
        snap.release()
