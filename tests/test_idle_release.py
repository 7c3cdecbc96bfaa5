"""An idle sandbox gives back the host's private copies of pages that hold the template's bytes
again (zb_sandbox_release_template_copies, Session.release_idle_memory, the engine server after
ZEROBOOT_IDLE_RELEASE seconds without a request; issue 18). The guest's state must be exactly as
before: its memory reads the same, and checkpoints, rollbacks and %rewind work as without it."""
from __future__ import annotations

import time

import pytest

from kernel_helpers import execute, kernel, result_text, stream_text
from session_helpers import cell, ok, run
from zeroboot_kernel.engine_server import IDLE_RELEASE_ENV, IDLE_RELEASE_S, idle_release_seconds


def _private_copies(guest_pages_host: int, pages: int) -> int:
    """Pages of [guest_pages_host, + pages * 4096) of this process that are private copies."""
    count = 0
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(guest_pages_host // 4096 * 8)
        data = f.read(pages * 8)
    for i in range(0, len(data), 8):
        e = int.from_bytes(data[i:i + 8], "little")
        count += bool(e >> 63 & 1) and not e >> 61 & 1
    return count


def _image_span() -> tuple[int, int]:
    """Host address range of this process's mappings of template images (its forks' memory)."""
    lo, hi = None, 0
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 5 and parts[5].endswith("memory.img"):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                lo = start if lo is None else min(lo, start)
                hi = max(hi, end)
    assert lo is not None, "no fork maps a template image"
    return lo, hi


def test_a_fork_gives_back_unchanged_pages_and_reads_the_same(template):
    sb = template.fork()
    try:
        sb.execute("import numpy as np\nx = 1\ntable = {i: str(i) for i in range(5000)}\narr = np.arange(1000)")
        lo, hi = _image_span()
        before = _private_copies(lo, (hi - lo) // 4096)
        released = sb.guest.release_template_copies()
        assert released > 0  # a cell writes pages that end as they were (reference counts)
        assert _private_copies(lo, (hi - lo) // 4096) <= before - released
        assert sb.guest.release_template_copies() == 0  # nothing left that equals the template
        r = sb.execute("x + len(table) + int(arr.sum()) + len(table[4999])")
        assert r.result["text/plain"] == str(1 + 5000 + 499500 + 4)
        r = sb.execute("import json; len(json.dumps(table))")  # the template's modules still work
        assert int(r.result["text/plain"]) > 0
    finally:
        sb.close()


def test_a_restore_after_the_release_brings_back_the_snapshot(template):
    sb = template.fork()
    try:
        sb.execute("data = list(range(10_000)); tag = 'kept'")
        snap = sb.guest.snapshot()
        try:
            assert sb.guest.release_template_copies() > 0
            sb.execute("data.clear(); tag = 'changed'; import gc; gc.collect()")
            sb.guest.release_template_copies()
            sb.restore(snap)
            assert sb.execute("tag, len(data), sum(data)").result["text/plain"] == "('kept', 10000, 49995000)"
        finally:
            snap.release()
    finally:
        sb.close()


def test_a_session_rolls_back_and_rewinds_across_idle_releases(template):
    from zeroboot_kernel.session import Session

    s = Session(template)
    try:
        assert run(s, "a = [1, 2, 3]", 1)["status"] == "ok"
        assert s.release_idle_memory() > 0
        assert run(s, "a.append(4)", 2)["status"] == "ok"
        s.release_idle_memory()
        s.rewind(1)  # to before `a.append(4)`
        s.release_idle_memory()
        assert ok(cell(s, "print(a)", 3)) == "[1, 2, 3]\n"
        s.prepare_next_cell()
        s.release_idle_memory()
        crash = run(s, "a.append(5)\nimport os; os._exit(3)", 4)  # the sandbox dies: rolled back
        assert crash["status"] == "error"
        s.release_idle_memory()
        assert ok(cell(s, "print(a)", 5)) == "[1, 2, 3]\n"
        assert s.stats()["released_mib"] > 0
    finally:
        s.close()


def test_an_idle_session_keeps_its_rewind_history_on_disk(template):
    """An idle session writes its %rewind checkpoints to the spill file (Session.spill_idle_
    checkpoints) and keeps in memory only what the next cell rolls back to: their memory goes,
    %rewind reads them back exactly, a crash still rolls back, and nothing about the budget is
    said (the budget was not exceeded)."""
    from zeroboot_kernel.session import Session

    s = Session(template, checkpoint_disk=1 << 30)
    try:
        stderr: list[str] = []
        ok(run(s, "seen = []", 1, stderr))
        for n in range(2, 6):  # four cells, each replacing the last one's 4 MiB
            ok(run(s, f"blob = bytes([{n}]) * (4 << 20); seen.append({n})", n, stderr))
        before = s.checkpoint_memory()
        s.release_idle_memory()
        s._reap_spills(wait=True)
        where = [cp.where() for cp in s.checkpoints]
        assert where == ["disk"] * 5, where  # the next cell rolls back to s.ready, still in memory
        assert s.ready is not None and not s.ready.released
        # the blobs of cells 2-4 were in memory only for %rewind
        assert s.checkpoint_memory() <= before - (12 << 20), (before, s.checkpoint_memory())
        info = s.describe_budget()
        assert info["spilled_while_idle"] == 5 and info["spilled_for_budget"] == 0 and info["on_disk"] == 5
        crash = run(s, "seen.append(6); blob = b''\nimport os; os._exit(3)", 6, stderr)
        assert crash["status"] == "error"
        assert ok(run(s, "print(seen, blob == bytes([5]) * (4 << 20))", 7, stderr)) == "[2, 3, 4, 5] True\n"
        msg = s.rewind(3)  # the crashed cell [6] left none: [7], [5], [4]
        assert "before cell [4]" in msg and "from disk" in msg, msg
        assert ok(run(s, "print(seen, blob == bytes([3]) * (4 << 20))", 8, stderr)) == "[2, 3] True\n"
        assert not [t for t in stderr if "budget" in t], stderr
    finally:
        s.close()


def test_an_idle_session_drops_no_checkpoint_for_want_of_disk(template):
    """Where the spill file has no room, the idle session keeps its checkpoints in memory: an idle
    pause never costs %rewind depth (the budget's spills make room by dropping the oldest)."""
    from zeroboot_kernel.session import Session

    # records hold every page that differs from the template: ~2, 4, 7 and 10 MiB here, so the
    # first two fit and the third does not
    s = Session(template, checkpoint_disk=12 << 20)
    try:
        ok(run(s, "blocks = []", 1))
        for n in range(2, 5):
            ok(run(s, f"blocks.append(bytes([{n}]) * (3 << 20))", n))
        for pause in range(2):  # the second pause finds the first one's spills written
            s.release_idle_memory()
            s._reap_spills(wait=True)
            ok(run(s, "pass", 5 + pause))
        depth = len(s.checkpoints)
        assert depth == 6 and not any(cp.dropped for cp in s.checkpoints)
        where = [cp.where() for cp in s.checkpoints]
        assert "disk" in where and "memory" in where, where
        assert "before cell [2]" in s.rewind(depth - 1)  # the oldest but one, wherever it is
        assert ok(run(s, "print(len(blocks))", 9)) == "0\n"
    finally:
        s.close()


def test_an_idle_engine_writes_the_history_and_gives_its_memory_back_unasked(template):
    """Through the engine server's loop: after ZEROBOOT_IDLE_RELEASE seconds without a request
    the checkpoints go to disk and their store pages back to the host, with no request needed
    to finish it (the loop once blocked on the next request right after starting the writes)."""
    import socket
    import threading

    from zeroboot_kernel.engine_server import EngineServer
    from zeroboot_kernel.native import dead_waiting_bytes
    from zeroboot_kernel.session import Session

    s = Session(template, checkpoint_disk=1 << 30)
    ours, theirs = socket.socketpair()
    thread = None
    try:
        for n in range(1, 4):
            ok(run(s, f"blob = bytes([{n}]) * (2 << 20)", n))
        server = EngineServer(theirs, s)
        server.idle_release_s = 0.1
        server.idle_release_due = True  # as after a request
        thread = threading.Thread(target=lambda: _serve_until_shutdown(server), daemon=True)
        thread.start()
        # polls: no request is sent meanwhile
        _wait_for(lambda: all(cp.where() == "disk" for cp in s.checkpoints) and dead_waiting_bytes() == 0, 300)
        assert [cp.where() for cp in s.checkpoints] == ["disk"] * 3
        assert dead_waiting_bytes() == 0
    finally:
        if thread is not None:
            _shut_down(ours, theirs, thread)
        else:
            ours.close()
            theirs.close()
        s.close()


def _rss_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Rss:"))


def test_freed_memory_kept_for_reuse_is_given_back_and_reads_as_zeros(template):
    """The arrays a cell replaced stay mapped for reuse (the next big allocation fills at memset
    speed); an idle session gives them back (Guest.release_freed). The guest sees no difference:
    its data is intact, a new allocation of that memory reads as zeros, and a rewind to a
    checkpoint that still held the freed array brings it back byte for byte."""
    from zeroboot_kernel.session import Session

    s = Session(template)
    try:
        digest = "hashlib.sha256(a.tobytes()).hexdigest()"
        ok(run(s, f"import numpy as np, hashlib; a = np.random.default_rng(1).random(8 << 20); d1 = {digest}", 1))
        ok(run(s, "b = a[:4].copy(); del a", 2))  # cell 1's `a` (64 MiB) freed
        rss = _rss_kib()
        freed = s.sandbox.guest.release_freed()
        assert freed >= (60 << 20) // 4096, freed  # the 64 MiB array, kept for reuse until now
        assert _rss_kib() <= rss - (48 << 10)
        assert s.sandbox.guest.release_freed() == 0  # nothing kept any more
        out = ok(run(s, "z = np.empty(8 << 20); print(int(np.count_nonzero(z)), b.size)", 3))
        assert out.split() == ["0", "4"]
        assert s.release_idle_memory() >= 0  # both releases together, between cells
        s.rewind(2)  # before cell 2: cell 1's `a`, from the checkpoint's copy
        assert ok(run(s, f"print({digest} == d1, 'b' in dir())", 4)).split() == ["True", "False"]
    finally:
        s.close()


def test_idle_release_seconds_come_from_the_environment():
    assert idle_release_seconds({}) == IDLE_RELEASE_S
    assert idle_release_seconds({IDLE_RELEASE_ENV: "0"}) == 0
    assert idle_release_seconds({IDLE_RELEASE_ENV: " 2.5 "}) == 2.5
    for bad in ("soon", "-1", "nan", "1e9"):
        assert idle_release_seconds({IDLE_RELEASE_ENV: bad}) == IDLE_RELEASE_S, bad


@pytest.mark.kvm
def test_an_idle_kernel_gives_back_pages_and_its_next_cells_see_the_same_state():
    """Through the kernel: after a short idle time the engine has given pages back (%sandbox stats
    says so), and the notebook's state, a crash's rollback and %rewind are as without it."""
    with kernel("zeroboot", **{IDLE_RELEASE_ENV: "0.2"}) as (km, kc):
        assert execute(kc, "import numpy as np\nv = np.arange(10)\nnames = ['a'] * 1000")[0]["status"] == "ok"
        deadline = time.monotonic() + 120  # polls, not a timing assumption: each stats call re-arms it
        released = "0.0 MiB"
        while time.monotonic() < deadline:
            _, msgs = execute(kc, "%sandbox stats")
            text = stream_text(msgs) + (result_text(msgs) or "")
            line = next(x for x in text.splitlines() if x.startswith("unchanged pages given back"))
            released = line.split()[-2]
            if float(released) > 0:
                break
            time.sleep(1)
        assert float(released) > 0, line
        reply, msgs = execute(kc, "print(int(v.sum()), len(names))")
        assert reply["status"] == "ok" and stream_text(msgs) == "45 1000\n"
        reply, _ = execute(kc, "v += 1\nimport os; os._exit(1)")
        assert reply["status"] == "error"
        time.sleep(0.5)  # the engine may release meanwhile: either way the rollback holds
        reply, msgs = execute(kc, "print(int(v.sum()))")
        assert reply["status"] == "ok" and stream_text(msgs) == "45\n"


class _IdleSession:
    """What the engine server sees of a session, counting its idle releases."""

    def __init__(self, threads: bool = False) -> None:
        self.releases = 0
        self.threads = threads

    def stats(self) -> dict:
        return {"releases": self.releases}

    def prepare_next_cell(self) -> None:
        pass

    def runs_between_cells(self) -> bool:
        return self.threads

    def spills_writing(self) -> bool:
        return False

    def release_idle_memory(self) -> int:
        self.releases += 1
        return 1


def _serving(session: _IdleSession, idle_s: float):
    import socket
    import threading

    from zeroboot_kernel import engine_wire as wire
    from zeroboot_kernel.engine_server import EngineServer

    ours, theirs = socket.socketpair()
    ours.settimeout(60)
    server = EngineServer(theirs, session)  # type: ignore[arg-type]
    server.idle_release_s = idle_s
    server.between_requests = lambda: time.sleep(0.01)  # type: ignore[method-assign]  # (threads "run")
    thread = threading.Thread(target=lambda: _serve_until_shutdown(server), daemon=True)
    thread.start()

    def request(op: str, rid: int) -> dict:
        wire.send(ours, {"op": op, "id": rid})
        return wire.recv(ours)

    return ours, theirs, thread, request


def _serve_until_shutdown(server) -> None:
    try:
        server.serve()
    except SystemExit:
        pass


def _shut_down(ours, theirs, thread) -> None:
    from zeroboot_kernel import engine_wire as wire

    wire.send(ours, {"op": "shutdown", "id": 99})
    thread.join(30)
    ours.close()
    theirs.close()


def _wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_the_engine_server_releases_once_per_idle_stretch_after_a_request():
    session = _IdleSession()
    ours, theirs, thread, request = _serving(session, 0.05)
    try:
        time.sleep(0.3)
        assert session.releases == 0  # no request ran yet: nothing to give back
        assert request("stats", 1)["event"] == "reply"
        assert _wait_for(lambda: session.releases == 1)
        assert not _wait_for(lambda: session.releases > 1, 0.5)  # once, until the next request
        assert request("stats", 2)["event"] == "reply"
        assert _wait_for(lambda: session.releases == 2)
    finally:
        _shut_down(ours, theirs, thread)


def test_the_engine_server_does_not_release_while_threads_of_user_code_run_or_when_off():
    for session, idle_s in ((_IdleSession(threads=True), 0.05), (_IdleSession(), 0.0)):
        ours, theirs, thread, request = _serving(session, idle_s)
        try:
            assert request("stats", 1)["event"] == "reply"
            assert not _wait_for(lambda: session.releases > 0, 0.5)
        finally:
            _shut_down(ours, theirs, thread)
