"""Escape battery, exhaustion: a guest tries to take more of the host than it is given (memory,
fds, overlay space and engine metadata, pipe buffers, output, time, a C loop the interpreter
cannot interrupt) and to confuse the host with frames it forges itself. Each is bounded or ends
that guest's cell only; the host process and the engine's fd count stay where they were."""
from __future__ import annotations

import os
import re
import resource

import pytest

import battery
from zeroboot_kernel.native import EventKind, lib

MIB = 1 << 20


def host_rss_mib() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // MIB


def host_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def result(r, key: str) -> str:
    m = re.search(rf"RESULT .*\b{key}=(\S+)", r.out)
    assert m, r.describe()
    return m.group(1)


def test_guest_memory_is_bounded_by_its_size():
    before = host_rss_mib()
    with battery.boot("exhaust", "mem") as sb:  # a 256 MiB guest
        r = battery.guest_c.drive(sb)
        grown = host_rss_mib() - before
    battery.completed(r, "mem")
    assert result(r, "errno") == "ENOMEM" and result(r, "huge") == "ENOMEM" and result(r, "brk") == "refused"
    assert 150 <= int(result(r, "mib")) <= 256
    assert grown <= 256 + 64, f"the host grew by {grown} MiB for a 256 MiB guest"


def test_memory_limit_below_the_guest_size():
    with battery.boot("exhaust", "mem") as sb:
        lib.zb_sandbox_set_memory_limit(sb.handle, 64 * MIB)
        r = battery.guest_c.drive(sb)
    battery.completed(r, "mem")
    assert int(result(r, "mib")) <= 64


@pytest.mark.parametrize("what", ["/dev/null", "host file"])
def test_fd_table_is_bounded_and_host_fds_come_back(what):
    path = what if what == "/dev/null" else os.path.realpath(__file__)
    view = [] if what == "/dev/null" else [os.path.dirname(path)]
    before = host_fds()
    with battery.boot("exhaust", "fds", path, view=view) as sb:
        r = battery.guest_c.drive(sb)
        held = host_fds() - before
    battery.completed(r, "fds")
    opened = int(result(r, "opened"))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if what == "/dev/null" or soft >= 2048:
        assert result(r, "errno") == "EMFILE" and opened == 1021  # 1024 minus stdio
    else:  # host fds for guests stop RLIMIT_NOFILE - 128 short, so the engine keeps fds of its own
        assert result(r, "errno") == "EMFILE" and opened <= soft - 128
    assert held <= 1024 + 8  # a host file open in the guest is at most one host fd
    assert host_fds() == before  # all given back with the sandbox


def test_output_is_cut_into_bounded_events():
    with battery.boot("exhaust", "output") as sb:
        r = battery.guest_c.drive(sb, timeout=60)
    battery.completed(r, "output")
    sizes = [len(e.data) for e in r.events if e.kind is EventKind.OUTPUT and e.stream == 2]
    assert max(sizes) <= MIB  # one write() of 64 MiB: one event of at most 1 MiB, a short write
    assert int(result(r, "first")) <= MIB


def test_a_guest_spinning_without_syscalls_is_stopped_at_its_deadline():
    import time
    t0 = time.monotonic()
    with battery.boot("exhaust", "spin") as sb:
        r = battery.guest_c.drive(sb, timeout=1.0)
        assert r.kind is EventKind.TIMEOUT, r.describe()
        assert not sb.finished  # paused, not broken: the caller decides
        assert sb.run(time.monotonic() + 0.2).kind is EventKind.TIMEOUT  # and it can be paused again
    assert time.monotonic() - t0 < 3
    battery.engine_still_works()


@pytest.mark.parametrize("what, per_item", [("symlinks", 4000), ("names", 255)])
def test_overlay_metadata_counts_against_the_overlay_limit(what, per_item):
    """Regression: only file data counted against the overlay's limit; symlink targets, names and
    inodes did not, so a guest could make the engine hold gigabytes (~4 KiB per symlink, copied
    again by every snapshot) without ever seeing ENOSPC."""
    limit = 16 * MIB
    before = host_rss_mib()
    with battery.boot("exhaust", what) as sb:
        lib.zb_sandbox_set_overlay_limit(sb.handle, limit)
        r = battery.guest_c.drive(sb, timeout=120)
        grown = host_rss_mib() - before
    battery.completed(r, what)
    assert result(r, "errno") == "ENOSPC"
    made = int(result(r, "symlinks" if what == "symlinks" else "files"))
    assert limit // (per_item + 1024) <= made <= limit // per_item, made
    assert grown <= 4 * limit // MIB, f"the host grew by {grown} MiB for a {limit // MIB} MiB overlay"


def test_pipe_buffers_are_bounded():
    """Regression: a pipe held up to 1 MiB of engine memory, copied by every snapshot; 510 pipes
    held 510 MiB. Pipes now hold 64 KiB, as Linux's do by default."""
    with battery.boot("exhaust", "pipes") as sb:
        r = battery.guest_c.drive(sb, timeout=60)
    battery.completed(r, "pipes")
    assert int(result(r, "pipe_size")) == 65536
    assert int(result(r, "pipes")) >= 500 and int(result(r, "mib")) <= 40


def test_fds_in_flight_are_bounded_and_cycles_end_with_the_sandbox():
    """Fds passed with SCM_RIGHTS: each socketpair of a cycle (an end in flight on its own full
    stream, every fd closed) is one reference in flight, so at most 1024 of them live (the rest
    ETOOMANYREFS), holding at most 1024 x 2 x 64 KiB of stream bytes; the sandbox's end frees them."""
    before = host_rss_mib()
    with battery.boot("exhaust", "scm_cycles") as sb:
        r = battery.guest_c.drive(sb, timeout=120)
        battery.completed(r, "scm_cycles")
        assert sb.fds_in_flight() == 1024
        grown = host_rss_mib() - before
    assert result(r, "cycles") == "1024" and result(r, "errno") == "ETOOMANYREFS", r.describe()
    assert grown <= 128 + 64, f"the host grew by {grown} MiB for 1024 cycles"


def test_a_chain_of_sockets_in_flight_goes_at_once():
    """1000 sockets each in flight on the next one's stream: closing the last frees the chain
    (iteratively, never by recursion on its depth), and the engine goes on."""
    with battery.boot("exhaust", "scm_chain") as sb:
        r = battery.guest_c.drive(sb, timeout=120)
        battery.completed(r, "scm_chain")
        assert sb.fds_in_flight() == 0
    assert result(r, "chain") == "1000" and result(r, "after") == "ok", r.describe()
    battery.engine_still_works()


def test_enlarged_pipes_are_bounded():
    """F_SETPIPE_SZ: 1 MiB per pipe at most, and 64 MiB of enlarged pipes per family (EPERM past
    it, as Linux's pipe-user-pages-soft refuses an unprivileged user), so ~500 pipes of 1 MiB
    cannot bring back the 510 MiB of #34."""
    before = host_rss_mib()
    with battery.boot("exhaust", "big_pipes") as sb:
        r = battery.guest_c.drive(sb, timeout=120)
        grown = host_rss_mib() - before
    battery.completed(r, "big_pipes")
    assert result(r, "errno") == "EPERM"
    assert int(result(r, "enlarged")) == 64 and int(result(r, "mib")) == 64
    assert grown <= 64 + 48, f"the host grew by {grown} MiB"


def test_memfd_growth_is_bounded_by_the_overlay_limit():
    """A memfd is an overlay file: written past the overlay limit it says ENOSPC; a sparse 1 TiB
    costs nothing; a shared mapping larger than the limit is guest memory, and its write-back
    fails rather than growing the file past the limit."""
    limit = 16 * MIB
    before = host_rss_mib()
    with battery.boot("exhaust", "memfd") as sb:
        lib.zb_sandbox_set_overlay_limit(sb.handle, limit)
        r = battery.guest_c.drive(sb, timeout=120)
        grown = host_rss_mib() - before
    battery.completed(r, "memfd")
    assert result(r, "errno") == "ENOSPC" and int(result(r, "mib")) < 16
    assert result(r, "sparse") == "0" and result(r, "truncate") == "0"
    assert grown <= 64 + 4 * limit // MIB + 32, f"the host grew by {grown} MiB for a {limit // MIB} MiB overlay"


# ---- at the session level: a cell of the kernel ----

@pytest.fixture(scope="module")
def template():
    from zeroboot_kernel.template import Template
    return Template.ensure()


SPIN_IN_C = ("import ctypes\nzb_code = ctypes.create_string_buffer(b'\\xeb\\xfe')  # jmp $\n"
             "ctypes.CFUNCTYPE(None)(ctypes.addressof(zb_code))()")


def test_c_code_spinning_forever_is_stopped_and_rolled_back(template):
    """ctypes calls machine code that loops forever: no bytecode runs, so KeyboardInterrupt can never
    be raised. The deadline stops it, the cell is rolled back, earlier state is intact."""
    import time
    from zeroboot_kernel.session import Session
    s = Session(template, timeout=1.5)
    try:
        assert s.execute("kept = 41", execution_count=1)["status"] == "ok"
        t0 = time.monotonic()
        reply = s.execute("lost = 1\n" + SPIN_IN_C, execution_count=2)
        assert time.monotonic() - t0 < 5
        assert reply["status"] == "error" and reply["ename"] == "SandboxTimeout", reply
        out: list[str] = []
        s.execute("print(kept + 1, 'lost' in globals())", execution_count=3, on_stream=lambda n, t: out.append(t))
        assert "".join(out) == "42 False\n"
    finally:
        s.close()


def test_c_code_spinning_ignores_an_interrupt_and_is_rolled_back(template):
    import threading
    from zeroboot_kernel.session import Session
    s = Session(template, interrupt_grace=0.5)
    try:
        threading.Timer(0.5, s.sandbox.interrupt).start()
        reply = s.execute(SPIN_IN_C, execution_count=1)
        assert reply["status"] == "error" and reply["ename"] == "SandboxTimeout", reply
        assert s.execute("1 + 1", execution_count=2)["status"] == "ok"
    finally:
        s.close()


FORGED = {
    # user code writes frames of its own to the agent's channel, in the agent's place
    "result_not_a_dict": (103, '{"execution_count": "x", "data": [1, 2], "metadata": 7}'),
    "display_odd": (102, '{"data": "str", "metadata": [], "transient": 5, "update": "yes"}'),
    "error_odd": (104, '{"ename": 1, "evalue": null, "traceback": "not a list"}'),
    "stream_odd": (101, '{"name": 42, "text": ["x"]}'),
    "unknown_type": (999, '{}'),
    "done_early": (107, '{"id": "nope", "status": 17}'),
    "complete_reply_mid_cell": (108, '{"id": 1, "matches": 5}'),
    "input_request_without_stdin": (106, '{"prompt": 5, "password": "x"}'),
    "clear_output": (105, '{"wait": "maybe"}'),
    "not_json": (101, '\\xff\\xfe not json'),
    "json_list": (101, '[1, 2, 3]'),
    "deep_json": (101, '[' * 100000 + ']' * 100000),
    "big_stream": (101, '{"name": "stdout", "text": "' + 'y' * (8 << 20) + '"}'),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_frames_forged_by_user_code_never_break_the_host(template, case):
    from zeroboot_kernel.session import Session
    ftype, payload = FORGED[case]
    code = ("import os, struct\nzb_p = " + repr(payload) + ".encode('latin-1')\n"
            "zb_fd = os.open('/dev/ttyS0', os.O_WRONLY)\n"
            f"zb_f = struct.pack('<IHHI', 0x5a42464d, 1, {ftype}, len(zb_p)) + zb_p\n"
            "while zb_f:\n    zb_f = zb_f[os.write(zb_fd, zb_f):]\n")
    s = Session(template, timeout=30)
    try:
        assert s.execute("kept = 1", execution_count=1)["status"] == "ok"
        reply = s.execute(code, execution_count=2)  # never raises, whatever the frame
        assert reply["status"] in ("ok", "error"), reply
        out: list[str] = []
        reply = s.execute("print(kept)", execution_count=3, on_stream=lambda n, t: out.append(t))
        assert reply["status"] == "ok" and "1\n" in "".join(out), (case, reply, out)
    finally:
        s.close()
