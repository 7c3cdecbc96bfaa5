"""Syscall fast paths (issue 24) keep their meaning: the engine keeps no metadata or listing cache
of host files between syscalls (every path walk and every open directory asks the host), so a file
edited, added or removed on the host while the kernel runs is seen by the very next syscall; big
listings (many getdents64 calls) and walks are exactly the host's; the syscall profile adds up."""
from __future__ import annotations

import json
import os

import pytest



def run(sb, code: str):
    r = sb.execute(f"import json, os\nprint(json.dumps({code}))")
    assert not r.error, r.error
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["overlay", "readonly"])
def test_host_edits_are_seen_by_the_next_syscall(template, tmp_path, mode) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a\n1\n")
    with template.fork() as sb:
        sb.guest.mount_project(str(tmp_path), mode)
        p = str(data)
        first = run(sb, f"[open({p!r}).read(), os.stat({p!r}).st_size, sorted(os.listdir({str(tmp_path)!r}))]")
        assert first == ["a\n1\n", 4, ["data.csv"]]
        data.write_text("a\n1\n2\n3\n")  # the user edits the CSV on the host, then re-reads it
        (tmp_path / "new.csv").write_text("b\n")
        second = run(sb, f"[open({p!r}).read(), os.stat({p!r}).st_size, sorted(os.listdir({str(tmp_path)!r}))]")
        assert second == ["a\n1\n2\n3\n", 8, ["data.csv", "new.csv"]]
        (tmp_path / "new.csv").unlink()
        assert run(sb, f"[os.path.exists({str(tmp_path / 'new.csv')!r}), os.listdir({str(tmp_path)!r})]") == \
            [False, ["data.csv"]]


def test_big_listing_and_walk_are_the_hosts(template, tmp_path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    for i in range(3000):  # ~100 KB of dirents: several getdents64 calls of glibc's 32 KiB buffer
        (big / f"file-with-a-longish-name-{i:05d}.txt").touch()
    (big / "sub").mkdir()
    for i in range(40):
        (big / "sub" / f"x{i}").touch()
    host_list = sorted(os.listdir(big))
    host_dirs = sorted(e.name for e in os.scandir(big) if e.is_dir())
    host_walk = sorted((os.path.relpath(d, big), sorted(ds), sorted(fs)) for d, ds, fs in os.walk(big))
    with template.fork() as sb:
        sb.guest.mount_project(str(tmp_path), "overlay")
        b = str(big)
        got = run(sb, f"[sorted(os.listdir({b!r})), sorted(e.name for e in os.scandir({b!r}) if e.is_dir()), "
                      f"sorted((os.path.relpath(d, {b!r}), sorted(ds), sorted(fs)) for d, ds, fs in os.walk({b!r}))]")
        assert got[0] == host_list
        assert got[1] == host_dirs
        assert [tuple(x) for x in got[2]] == host_walk


def test_syscall_profile_accounts_for_each_phase(template, tmp_path) -> None:
    (tmp_path / "f").write_text("x")
    with template.fork() as sb:
        sb.guest.mount_project(str(tmp_path), "overlay")
        sb.guest.set_profile(True)
        run(sb, f"[os.stat({str(tmp_path / 'f')!r}).st_size for _ in range(20)]")
        sb.guest.set_profile(False)
        prof = sb.guest.syscall_profile()
        assert prof["syscalls"] >= 20 and prof["path_walks"] >= 20
        for phase in ("kvm_run_ns", "decode_ns", "dispatch_ns", "path_ns", "host_ns", "return_ns"):
            assert prof[phase] > 0, phase
        assert prof["path_ns"] <= prof["dispatch_ns"]
        run(sb, "os.getpid()")  # profiling off: nothing more is counted
        assert sb.guest.syscall_profile() == prof


def test_per_syscall_profile_counts_by_number_and_is_off_by_default(template, tmp_path) -> None:
    (tmp_path / "f").write_text("x")
    f = str(tmp_path / "f")
    with template.fork() as sb:
        sb.guest.mount_project(str(tmp_path), "overlay")
        run(sb, f"[os.getppid() for _ in range(5)] + [os.stat({f!r}).st_size]")
        assert sb.guest.syscall_profile_by_number() == {}  # never switched on: nothing collected
        sb.guest.set_profile(True)  # the cell's own syscalls (the agent's), to subtract
        run(sb, f"[os.getppid() for _ in range(0)] + [os.stat({f!r}).st_size for _ in range(0)]")
        sb.guest.set_profile(False)
        base = sb.guest.syscall_profile_by_number().get("getppid", {"calls": 0})["calls"]
        sb.guest.set_profile(True)
        run(sb, f"[os.getppid() for _ in range(37)] + [os.stat({f!r}).st_size for _ in range(11)]")
        sb.guest.set_profile(False)
        rows = sb.guest.syscall_profile_by_number()
        assert rows["getppid"]["calls"] == 37 + base and rows["getppid"]["nr"] == 110
        assert rows["getppid"]["host_calls"] == 0  # answered from the engine's own state
        assert rows["newfstatat"]["calls"] >= 11
        assert rows["newfstatat"]["host_calls"] >= 11  # a host file: at least its lstat each time
        for v in rows.values():
            assert v["exit_ns"] > 0 and v["return_ns"] > 0
        total = sb.guest.syscall_profile()
        assert sum(v["calls"] for v in rows.values()) == total["syscalls"]
        assert sum(v["host_calls"] for v in rows.values()) == total["host_calls"]
        run(sb, "os.getpid()")  # off again: the rows stay as they were
        assert sb.guest.syscall_profile_by_number() == rows
        sb.guest.set_profile(True)  # switching it on starts from zero
        sb.guest.set_profile(False)
        assert sb.guest.syscall_profile_by_number() == {}


def test_a_jump_to_the_syscall_entry_is_only_a_syscall(template) -> None:
    """LSTAR's page (guest_abi.h ZB_SYSCALL_ENTRY) is user-executable: user code jumping there with
    registers of its choice gets what the `syscall` instruction would give it (here getpid, back
    at the address in rcx), and can read the page but not write it."""
    code = r'''
import ctypes, mmap, os
# mov eax, 39 (getpid); lea rcx, [rip + 13] (the ret below); movabs r11, 0xe000; jmp r11; ret
prog = bytes([0xb8, 39, 0, 0, 0, 0x48, 0x8d, 0x0d, 13, 0, 0, 0, 0x49, 0xbb]) + (0xe000).to_bytes(8, "little") + \
    bytes([0x41, 0xff, 0xe3, 0xc3])
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(prog)
f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print([f(), os.getpid(), ctypes.string_at(0xe180, 2).hex()])
'''
    with template.fork() as sb:
        r = sb.execute(code)
        assert not r.error, r.error
        got, pid, entry = json.loads(r.stdout.strip().splitlines()[-1].replace("'", '"'))
        assert got == pid and entry == "e6e0"  # `out %al, $0xe0` at ZB_SYSCALL_ENTRY_OUT


@pytest.mark.parametrize("mode", ["overlay", "readwrite"])
def test_stat_reuses_the_walk_only_within_one_syscall(template, tmp_path, mode) -> None:
    """os.stat reuses its path walk's host lstat (one host call, not two); what it returns must
    still be the host's state at that syscall: symlinks followed or not as asked, files changed on
    the host or by the guest between two calls, an open file's fstat and lseek(SEEK_END)."""
    a = tmp_path / "a"
    a.write_bytes(b"0123456789")
    (tmp_path / "l").symlink_to("a")
    (tmp_path / "d").mkdir()
    A, L, D = str(a), str(tmp_path / "l"), str(tmp_path / "d")
    with template.fork() as sb:
        sb.guest.mount_project(str(tmp_path), mode)
        sb.guest.set_profile(True)
        first = run(sb, f"[os.stat({A!r}).st_size, os.stat({L!r}).st_size, os.lstat({L!r}).st_size, "
                        f"__import__('stat').S_ISLNK(os.lstat({L!r}).st_mode), __import__('stat').S_ISDIR(os.stat({D!r}).st_mode)]")
        sb.guest.set_profile(False)
        assert first == [10, 10, 1, True, True]
        assert sb.guest.syscall_profile_by_number()["newfstatat"]["host_calls"] >= 1
        run(sb, f"globals().setdefault('f', open({A!r}, 'rb')).fileno()")  # kept open across cells
        a.write_bytes(b"0123456789abcdefghij")  # the host changes it
        assert run(sb, f"[os.stat({A!r}).st_size, os.stat({L!r}).st_size, os.fstat(f.fileno()).st_size, "
                       f"os.lseek(f.fileno(), 0, os.SEEK_END), os.lseek(f.fileno(), 3, os.SEEK_SET), "
                       f"os.lseek(f.fileno(), 2, os.SEEK_CUR), f.read(2).decode()]") == [20, 20, 20, 20, 3, 5, "56"]
        # the guest changes it (overlay: in its upper layer; readwrite: on the host)
        assert run(sb, f"[open({A!r}, 'w').write('xyz'), os.stat({A!r}).st_size, os.rename({A!r}, {A!r} + '2'), "
                       f"os.path.exists({A!r}), os.stat({A!r} + '2').st_size, os.path.exists({L!r})]") == \
            [3, 3, None, False, 3, False]
        a2 = tmp_path / "a2"
        if mode == "readwrite":
            assert a2.read_bytes() == b"xyz" and not a.exists()
        else:
            assert a.read_bytes() == b"0123456789abcdefghij" and not a2.exists()



_OPEN_DIR = """
def open_dir(p):
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        return e.errno
    names = sorted(os.listdir(fd))
    os.close(fd)
    return names
"""


@pytest.mark.parametrize("mode", ["overlay", "readonly"])
def test_a_directory_open_asks_the_host_at_each_call(template, tmp_path, mode) -> None:
    """Opening a directory is the walk's lstat of each component plus the host's open with
    O_DIRECTORY | O_NOFOLLOW, which itself refuses anything else (no fstat after it), and a close:
    nothing is kept between calls, so what the host changes between two guest calls is seen by the
    second (new entries, the directory replaced by a file, by a symlink, by another directory)."""
    import errno

    d = tmp_path / "a" / "b"
    d.mkdir(parents=True)
    (d / "x").write_text("1")
    code = f"open_dir({str(d)!r})"
    with template.fork() as sb:
        sb.guest.mount_project(str(tmp_path), mode)
        r = sb.execute("import os" + _OPEN_DIR)
        assert not r.error, r.error
        sb.guest.set_profile(True)
        assert run(sb, code) == ["x"]
        sb.guest.set_profile(False)
        prof = sb.guest.syscall_profile_by_number()["openat"]
        # lstat a, a/b; the open (no fstat after it; was 4); the close is a raw close, not counted
        assert prof["calls"] == 1 and prof["host_calls"] == 3, prof
        (d / "y").write_text("2")  # the host adds an entry
        assert run(sb, code) == ["x", "y"]
        for f in ("x", "y"):
            (d / f).unlink()
        d.rmdir()
        d.write_text("now a file")  # the host replaces the directory with a file
        assert run(sb, code) == errno.ENOTDIR
        d.unlink()
        d.symlink_to(tmp_path / "a")  # ... with a symlink to its parent: followed by the guest's walk
        assert run(sb, code) == ["b"]
        d.unlink()
        os.mkfifo(d)  # ... with a FIFO: ENOTDIR at once, as Linux (the open never waits for a writer)
        assert run(sb, code) == errno.ENOTDIR
        d.unlink()
        d.mkdir()
        (d / "z").write_text("3")  # ... with another directory
        assert run(sb, code) == ["z"]


# Guest code for the rewritten syscall sites (guest_abi.h, native/syscall_sites.c): `stub(nr)`
# writes `mov eax, nr; syscall; ret` (or another tail) into a fresh mapping (at the hinted address
# where it is taken) and returns it as a callable, a function reading the two bytes of its
# `syscall`, and its address.
_SITES = r'''
import ctypes, mmap, os, signal, json
PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]

def stub(nr, flags=PRIVATE, at=0, tail=b"\xc3", hint=0):
    """mov eax, nr; syscall; <tail> at offset `at` of a fresh two-page mapping (read, write, exec)"""
    base = libc.mmap(hint, 8192, 7, flags, -1, 0)
    ctypes.memmove(base + at, bytes([0xb8]) + nr.to_bytes(4, "little") + b"\x0f\x05" + tail, 7 + len(tail))
    f = ctypes.CFUNCTYPE(ctypes.c_long)(base + at)
    return f, (lambda: ctypes.string_at(base + at + 5, 2).hex()), base + at

def calls(f, site, n):
    """n calls of f, with its site's bytes after each"""
    out = []
    for _ in range(n):
        out.append([f(), site()])
    return out
'''


def sites(sb, code: str):
    r = sb.execute(_SITES + code)
    assert not r.error, r.error
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_syscall_site_is_rewritten_at_its_second_exit_and_means_the_same(template) -> None:
    """getppid through a private stub: its `syscall` (0f05) becomes the port's `out` (e6e0) at its
    second exit, and every call returns the same; rcx and r11 come back as `syscall` sets them
    (the return address, RFLAGS) on both paths."""
    with template.fork() as sb:
        before = sb.guest.stats()["syscall_sites"]
        got = sites(sb, "f, site, at = stub(110)\n"
                        "g, gsite, gat = stub(110, tail=b'\\x48\\x89\\xc8\\xc3')\n"  # mov rax, rcx; ret
                        "h, hsite, hat = stub(110, tail=b'\\x4c\\x89\\xd8\\xc3')\n"  # mov rax, r11; ret
                        "print(json.dumps([calls(f, site, 4), os.getppid(), calls(g, gsite, 3), gat + 7, "
                        "[h() & 0x202 for _ in range(3)], hsite()]))")
        f_calls, ppid, g_calls, ret_addr, flags, hsite = got
        assert [c[1] for c in f_calls] == ["0f05", "e6e0", "e6e0", "e6e0"]
        assert [c[0] for c in f_calls] == [ppid] * 4
        assert g_calls == [[ret_addr, "0f05"], [ret_addr, "e6e0"], [ret_addr, "e6e0"]]
        assert flags == [0x202] * 3 and hsite == "e6e0"
        assert sb.guest.stats()["syscall_sites"] >= before + 3  # (the cell's own code may add others)


def test_sites_others_can_see_or_the_entry_answers_are_not_rewritten(template) -> None:
    """A `syscall` in a MAP_SHARED mapping (its bytes are a file's or another process's), one
    across two pages, and one calling a number the entry answers in the guest keep their bytes."""
    from zeroboot_kernel.native import Engine

    answers = Engine.default().set_syscall_path()[2]
    with template.fork() as sb:
        got = sites(sb, "f, site, _ = stub(110, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
                        "g, gsite, _ = stub(110, at=4096 - 6)\n"  # 0f at 4095, 05 at 4096
                        "h, hsite, _ = stub(39)\n"  # getpid
                        "print(json.dumps([calls(f, site, 3), calls(g, gsite, 3), calls(h, hsite, 3), os.getppid(), "
                        "os.getpid()]))")
        shared, across, getpid, ppid, pid = got
        assert shared == [[ppid, "0f05"]] * 3
        assert across == [[ppid, "0f05"]] * 3
        assert [c[0] for c in getpid] == [pid] * 3
        assert [c[1] for c in getpid] == (["0f05"] * 3 if answers else ["0f05", "e6e0", "e6e0"])


def test_site_rewriting_can_be_switched_off(template) -> None:
    from zeroboot_kernel.native import Engine

    engine = Engine.default()
    with template.fork() as sb:
        try:
            assert engine.set_syscall_path(site_rewrite=False)[3] is False
            off = sites(sb, "f, site, _ = stub(110)\nprint(json.dumps(calls(f, site, 4)))")
        finally:
            assert engine.set_syscall_path()[3] is True
        assert [c[1] for c in off] == ["0f05"] * 4


def test_a_rewritten_site_blocks_is_interrupted_and_forks_as_a_syscall(template) -> None:
    """pause() through a rewritten site waits and is interrupted by SIGALRM (EINTR, the handler
    ran); a forked child runs a site its parent rewrote; a site whose first call ends the process
    (exit) is never rewritten; the parent's waitpid gets each child's status."""
    code = ("hits = []\n"
            "signal.signal(signal.SIGALRM, lambda *a: hits.append(1))\n"
            "p, psite, _ = stub(34)\n"  # pause
            "res = []\n"
            "for _ in range(3):\n"
            "    signal.setitimer(signal.ITIMER_REAL, 0.05)\n"
            "    res.append([p(), psite()])\n"
            "f, site, _ = stub(110)\n"
            "calls(f, site, 2)\n"
            "e, esite, _ = stub(60)\n"  # exit(rdi): rdi is ctypes' first argument
            "e.argtypes = [ctypes.c_long]\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(7 if f() == os.getppid() and site() == 'e6e0' else 1)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "pid2 = os.fork()\n"
            "if pid2 == 0:\n"
            "    e(3); e(5)\n"  # first call exits with 3: a site never run twice stays
            "_, status2 = os.waitpid(pid2, 0)\n"
            "print(json.dumps([res, len(hits), os.waitstatus_to_exitcode(status), "
            "os.waitstatus_to_exitcode(status2), esite()]))")
    with template.fork() as sb:
        res, hits, child, child2, esite = sites(sb, code)
        assert res == [[-4, "0f05"], [-4, "e6e0"], [-4, "e6e0"]]
        assert hits == 3
        assert child == 7 and child2 == 3 and esite == "0f05"


# An answered number's site (guest_abi.h "Stubbed syscall sites"): `at(nr, hint)` is `stub`'s
# site one byte into its mapping (the host reads the byte before a site: a REX prefix is no `mov
# eax`), as a callable of three arguments, and its address; `code(addr)` reads its first seven
# bytes back.
_STUBBED = r'''
ARGS3 = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)

def at(nr, hint, tail=b"\xc3"):
    _, _, addr = stub(nr, at=1, tail=tail, hint=hint)
    return ARGS3(addr), addr

def code(addr):
    return ctypes.string_at(addr, 7).hex()
'''


def test_a_mov_to_r8d_before_a_syscall_is_not_stubbed(template) -> None:
    """`41 b8 imm32 0f 05` is `mov $imm32, %r8d; syscall`: its last seven bytes look like glibc's
    `mov $nr, %eax; syscall`, and with rax holding that number by chance the host must still leave
    it alone (rewriting from the b8 would drop the r8d load)."""
    code = _STUBBED + (
        "page = libc.mmap(0, 4096, 7, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)\n"
        # mov $3, %eax; mov $3, %r8d; syscall; mov %r8, %rax; ret
        "ctypes.memmove(page, b'\\xb8\\x03\\0\\0\\0\\x41\\xb8\\x03\\0\\0\\0\\x0f\\x05\\x4c\\x89\\xc0\\xc3', 19)\n"
        "f = ARGS3(page)\n"
        "print(json.dumps([[f(-1, 0, 0) for _ in range(3)], ctypes.string_at(page + 5, 8).hex()]))")
    with template.fork() as sb:
        results, site = sites(sb, code)
    assert results == [3] * 3 and site == "41b8030000000f05"


def test_an_answered_numbers_site_jumps_to_a_stub_and_means_the_same(template, tmp_path) -> None:
    """lseek through a private `mov eax, 8; syscall`: at its second exit (a pipe: ESPIPE, which the
    host answers) its `mov` becomes a `jmp` (e9) to a stub and its `syscall` bytes stay; then the
    entry answers lseek of an open file through the stub without an exit (the sandbox serves no
    syscall for 500 calls) and exits through it for the pipe, both as before; rcx comes back as the
    return address on both paths."""
    (tmp_path / "f").write_text("abcdef")
    f = str(tmp_path / "f")
    code = _STUBBED + (
        "seek, addr = at(8, 0)\n"
        "rcx, raddr = at(8, 0, tail=b'\\x48\\x89\\xc8\\xc3')\n"  # mov rax, rcx; ret
        "r11, _ = at(8, 0, tail=b'\\x4c\\x89\\xd8\\xc3')\n"  # mov rax, r11; ret
        f"fd = os.open({f!r}, os.O_RDONLY); os.read(fd, 3)\n"
        "rp, wp = os.pipe()\n"
        "pipe = [[seek(rp, 0, 1), code(addr)] for _ in range(3)]\n"
        "rets = [[rcx(fd, 0, 1), rcx(rp, 0, 1), code(raddr)] for _ in range(3)]\n"
        "flags = [r11(k, 0, 1) for k in (fd, rp, fd, rp, fd, rp)]\n"
        "print(json.dumps([pipe, seek(fd, 0, 1), rets, raddr + 7, flags]))")
    with template.fork() as sb:
        sb.guest.mount_project(str(tmp_path), "readonly")
        before = sb.guest.stats()["syscall_stubs"]
        pipe, pos, rets, ret_addr, flags = sites(sb, code)
        stubbed = sb.guest.stats()["syscall_stubs"] - before
        served = [sb.guest.stats()["syscalls"]]
        many = sites(sb, "print(json.dumps([seek(fd, 0, 1) for _ in range(500)][-1]))")
        served.append(sb.guest.stats()["syscalls"])
        plain = sites(sb, "print(json.dumps(3))")
        served.append(sb.guest.stats()["syscalls"])
    assert pipe == [[-29, "b8080000000f05"], [-29, "e9" + pipe[1][1][2:10] + "0f05"]] + [pipe[1]]
    assert pos == 3
    assert [r[2][:2] for r in rets] == ["b8", "e9", "e9"] and all(r[2][-4:] == "0f05" for r in rets)
    assert [r[:2] for r in rets] == [[ret_addr, ret_addr]] * 3
    # r11 as `syscall` leaves it (RFLAGS, IF set) before the stub; after it what PVM reports at the
    # entry (0x202: the arithmetic flags, which glibc's wrappers declare clobbered, are not kept)
    # (its site is stubbed at its second exit: the fourth call)
    assert all(f & 0x202 == 0x202 for f in flags[:4]) and flags[4:] == [0x202] * 2
    assert stubbed >= 3  # (the cell's own code may add others: glibc's lseek wrapper is one)
    assert many == plain == 3
    assert (served[1] - served[0]) - (served[2] - served[1]) < 50  # the 500 calls were answered


def test_stubs_need_reach_and_room_else_the_syscall_stays(template) -> None:
    """A site more than 2 GiB below the stub page keeps its `syscall`; so do the sites past the
    page's last free slot; every call returns what the host or the entry says (close(-1): EBADF)."""
    code = _STUBBED + (
        "far, faddr = at(3, 0x20000000)\n"  # 512 MiB: ~3.5 GiB below the stub page near the stack
        "near = [at(3, 0) for _ in range(140)]\n"
        "got = [[far(-1, 0, 0) for _ in range(3)], code(faddr)]\n"
        "res = [[f(-1, 0, 0), f(-1, 0, 0), f(-1, 0, 0)] for f, _ in near]\n"
        "print(json.dumps([got, faddr, res, [code(a)[:2] for _, a in near]]))")
    with template.fork() as sb:
        (far_calls, far_code), far_addr, res, heads = sites(sb, code)
    assert far_addr == 0x20000001  # the hint was taken
    assert far_calls == [-9] * 3 and far_code == "b8030000000f05"
    assert res == [[-9] * 3] * 140
    assert set(heads) == {"b8", "e9"}
    assert 100 <= heads.count("e9") <= 127  # the page's slots, less those the process's own sites use


@pytest.mark.parametrize("how", ["munmap", "madvise"])
def test_a_stub_page_taken_away_gives_the_sites_their_mov_back(template, how) -> None:
    """A process that unmaps its stub page (or zeroes it with MADV_DONTNEED) gets every stubbed
    site's `mov` back before the page goes, so no call jumps into a stub that is gone; after
    munmap no site is stubbed again (the page is gone), after madvise the emptied page serves
    new stubs."""
    code = _STUBBED + (
        "f, addr = at(3, 0)\n"
        "first = [f(-1, 0, 0) for _ in range(3)] + [code(addr)]\n"
        "page = next(int(l.split('-')[0], 16) for l in open('/proc/self/maps') if '[syscall stubs]' in l)\n"
        f"libc.{how}.argtypes = [ctypes.c_void_p, ctypes.c_size_t" + (", ctypes.c_int]\n" if how == "madvise" else "]\n") +
        f"assert libc.{how}(page, 4096" + (", 4) == 0\n" if how == "madvise" else ") == 0\n") +
        "after = [code(addr)] + [f(-1, 0, 0) for _ in range(3)] + [code(addr)]\n"
        "g, gaddr = at(3, 0)\n"
        "new = [g(-1, 0, 0) for _ in range(3)] + [code(gaddr)]\n"
        "print(json.dumps([first, after, new, '[syscall stubs]' in open('/proc/self/maps').read()]))")
    with template.fork() as sb:
        first, after, new, still = sites(sb, code)
    assert first[:3] == [-9] * 3 and first[3][:2] == "e9"
    assert after[0] == "b8030000000f05" and after[1:4] == [-9] * 3
    assert new[:3] == [-9] * 3
    if how == "munmap":
        assert not still and after[4] == new[3] == "b8030000000f05"
    else:
        assert still and after[4][:2] == new[3][:2] == "e9"


def test_the_answered_numbers_are_the_entrys() -> None:
    """guest_abi.h's ZB_ENTRY_ANSWERED_NRS (stubbed, not rewritten, while the entry answers) lists exactly
    the numbers cpl0_entry.S compares rax with."""
    import re
    from pathlib import Path

    guest = Path(__file__).resolve().parent.parent / "guest"
    asm = set(int(n) for n in re.findall(r"cmpq \$(\d+), %rax", (guest / "cpl0_entry.S").read_text()))
    asm |= {0}  # `testq %rax, %rax`: read
    header = re.search(r"#define ZB_ENTRY_ANSWERED_NRS ([\d, ]+)", (guest / "guest_abi.h").read_text())
    assert header and set(int(n) for n in header.group(1).split(",")) == asm
