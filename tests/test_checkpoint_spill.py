"""Checkpoints spilled to disk (issue 23, checkpoint_spill.py): over the memory budget the oldest
checkpoints go to a per-session file, %rewind reads them back exactly, a corrupt spill is an error
for that rewind only, the disk budget holds, and no file is left after the session."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zeroboot_kernel import checkpoint_spill as spill
from zeroboot_kernel import magics as mg
from zeroboot_kernel.checkpoint_budget import BudgetSyntaxError
from zeroboot_kernel.errors import SandboxError
from zeroboot_kernel.native import snapshots_memory
from zeroboot_kernel.session import Checkpoint, Session

from session_helpers import run

MIB = 1 << 20
# 48 MiB of fresh pseudo-random data per cell (replacing the last cell's), and its sha256
CELL = ("rng = np.random.default_rng({n}); a = rng.random(6 * 1024 * 1024); "
        "digest = hashlib.sha256(a.tobytes()).hexdigest()")


def test_spilled_checkpoints_rewind_exactly_and_are_listed(template) -> None:
    s = Session(template, checkpoint_memory=120 * MIB, checkpoint_disk=2 << 30, spill_waits=True)
    try:
        stderr: list[str] = []
        assert run(s, "import numpy as np, hashlib", 1, stderr)["status"] == "ok"
        for n in range(2, 9):
            assert run(s, CELL.format(n=n), n, stderr)["status"] == "ok"
        assert s.spill is not None and s.budget_spilled >= 3
        where = [cp.where() for cp in s.checkpoints]
        assert where[0] == "disk" and where[-1] == "memory" and len(where) == 8, where
        info = s.describe_budget()
        assert info["on_disk"] == where.count("disk") and info["rewind_depth"] == 8
        assert info["disk_used_bytes"] > 0 and s.checkpoint_memory() <= 120 * MIB
        text = mg.format_checkpoints(s.describe_checkpoints(), s.mode, info)
        assert "on disk" in text and " disk " in text
        assert [t for t in stderr if "written to disk" in t], stderr
        # %rewind 5 lands before cell [4]: `a` is cell 3's, byte for byte
        msg = s.rewind(5)
        assert "before cell [4]" in msg and "from disk" in msg
        got = run(s, "print(hashlib.sha256(a.tobytes()).hexdigest(), digest)", 20)["stdout"].split()
        expect = run(s, "r = np.random.default_rng(3).random(6 * 1024 * 1024); "
                        "print(hashlib.sha256(r.tobytes()).hexdigest())", 21)["stdout"].split()
        assert got[0] == got[1] == expect[0]
        # the rewound-past records are freed
        assert s.spill.used == sum(spill.span(cp.spilled.length) for cp in s.checkpoints if cp.spilled is not None)
        fd = s.spill.fd
        assert "/spill/" in os.readlink(f"/proc/self/fd/{fd}")
        # the writer's records: the aligned layout, each on a block, page contents written O_DIRECT
        assert {cp.spilled.codec for cp in s.checkpoints if cp.spilled is not None} == {spill.CODEC_ALIGNED}
        assert all(cp.spilled.offset % spill.ALIGN == 0 for cp in s.checkpoints if cp.spilled is not None)
        flags = int(Path(f"/proc/self/fdinfo/{s.spill.direct_fd}").read_text().split("flags:")[1].split()[0], 8)
        assert flags & os.O_DIRECT
    finally:
        s.close()
    # the session's end closes the file: its space goes with it (it never had a name)
    assert s.spill is None
    try:
        assert "/spill/" not in os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        pass


def _spilled(template, last: int) -> Session:
    """A session whose cells 2..last each replaced 48 MiB under a 120 MiB budget, waiting for the
    spill writer: its older checkpoints are on disk."""
    s = Session(template, checkpoint_memory=120 * MIB, checkpoint_disk=2 << 30, spill_waits=True)
    try:
        assert run(s, "import numpy as np, hashlib", 1)["status"] == "ok"
        for n in range(2, last + 1):
            assert run(s, CELL.format(n=n), n)["status"] == "ok"
        assert s.spill is not None
    except BaseException:
        s.close()
        raise
    return s


def test_a_corrupt_spill_fails_that_rewind_only(template) -> None:
    s = _spilled(template, 7)
    try:
        assert s.spill is not None
        disk = [cp for cp in s.checkpoints if cp.spilled is not None]
        assert len(disk) >= 2
        oldest = disk[0].spilled
        assert oldest is not None
        os.pwrite(s.spill.fd, b"\xff" * 64, oldest.offset + spill.HEAD.size + 4096)  # a flipped page
        depth = len(s.checkpoints)
        with pytest.raises(SandboxError, match="cannot be read back.*checksum"):
            s.rewind(depth)
        assert len(s.checkpoints) == depth - 1
        # the session is unchanged and goes on; a sound spilled one still rewinds
        assert run(s, "print(int(a.size))", 30)["stdout"].strip() == str(6 * 1024 * 1024)
        assert s.checkpoints[0].spilled is not None and s.checkpoints[0].number == 2
        assert "from disk" in s.rewind(len(s.checkpoints))  # before cell [2]: numpy imported, no `a` yet
        assert run(s, "print('a' in dir(), np.zeros(2).sum())", 31)["stdout"].strip() == "False 0.0"
    finally:
        s.close()


def test_every_part_of_an_aligned_record_is_checked(template) -> None:
    """The spill writer's records (header, state, page index, zeros, page contents read straight
    into the snapshot, MAC): a flipped byte anywhere, or a cut-off file, is a SpillError and no
    snapshot; restored, the record loads."""
    s = _spilled(template, 5)
    try:
        assert s.spill is not None
        s._reap_spills(wait=True)
        ref = max((cp.spilled for cp in s.checkpoints if cp.spilled is not None and not cp.spilled.pending),
                  key=lambda r: r.offset)  # the file's last record
        assert ref.codec == spill.CODEC_ALIGNED and ref.length > 40 * MIB
        head = spill.HEAD.unpack(os.pread(s.spill.fd, spill.HEAD.size, ref.offset))
        state_len = head[3]
        records = int.from_bytes(os.pread(s.spill.fd, 8, ref.offset + spill.HEAD.size + state_len), "little")
        data = spill.span(spill.HEAD.size + state_len + 8 * (1 + records))
        assert data < ref.length - spill.MAC_BYTES - spill.PAGE
        places = {"codec": 16, "state": spill.HEAD.size + 3, "count": spill.HEAD.size + state_len,
                  "a page word": spill.HEAD.size + state_len + 8 + 8 * (records // 2),
                  "the zeros": data - 1, "first page": data, "a page": data + (ref.length - data) // 2,
                  "MAC": ref.length - 1}
        size = s._memory_size()
        for what, at in places.items():
            good = os.pread(s.spill.fd, 1, ref.offset + at)
            os.pwrite(s.spill.fd, bytes([good[0] ^ 0x5a]), ref.offset + at)
            with pytest.raises(spill.SpillError):
                s.spill.load(ref, s.clean, size).release()
                pytest.fail(f"a flipped byte in {what} was not noticed")
            os.pwrite(s.spill.fd, good, ref.offset + at)
        end = os.fstat(s.spill.fd).st_size
        assert ref.offset + ref.length == end
        tail = os.pread(s.spill.fd, spill.MAC_BYTES + 8, end - spill.MAC_BYTES - 8)
        os.ftruncate(s.spill.fd, end - spill.MAC_BYTES - 8)
        with pytest.raises(spill.SpillError, match="truncated"):
            s.spill.load(ref, s.clean, size)
        os.pwrite(s.spill.fd, tail, end - spill.MAC_BYTES - 8)
        s.spill.load(ref, s.clean, size).release()
        assert run(s, "print(int(a.size))", 30)["stdout"].strip() == str(6 * 1024 * 1024)
    finally:
        s.close()


def test_spills_go_through_the_other_descriptor_where_o_direct_is_refused(template) -> None:
    """A file system that refuses O_DIRECT writes or reads like these: the writer and %rewind use
    the spill file's buffered descriptor instead, and the checkpoints round-trip as before."""
    s = Session(template, checkpoint_memory=120 * MIB, checkpoint_disk=2 << 30, spill_waits=True)
    assert s.spill is not None
    direct = s.spill.direct_fd
    s.spill.direct_fd = os.open(f"/proc/self/fd/{s.spill.fd}", os.O_RDONLY | os.O_CLOEXEC)  # refuses writes
    try:
        assert run(s, "import numpy as np, hashlib", 1)["status"] == "ok"
        for n in range(2, 7):
            assert run(s, CELL.format(n=n), n)["status"] == "ok"
        s._reap_spills(wait=True)
        disk = [cp for cp in s.checkpoints if cp.where() == "disk"]
        assert len(disk) >= 3 and not s.spill_reason, ([cp.where() for cp in s.checkpoints], s.spill_reason)
        os.close(s.spill.direct_fd)
        s.spill.direct_fd = os.open(f"/proc/self/fd/{s.spill.fd}", os.O_WRONLY | os.O_CLOEXEC)  # refuses reads
        cp = disk[-1]
        depth_of = {c.number: len(s.checkpoints) - i for i, c in enumerate(s.checkpoints)}
        assert "from disk" in s.rewind(depth_of[cp.number])
        _exact(s, cp)
    finally:
        os.close(s.spill.direct_fd)
        s.spill.direct_fd = direct
        s.close()


def test_the_mac_is_gmac_and_parts_add_up() -> None:
    """native.Mac is AES-256-GCM's tag over the bytes as associated data (checked against another
    implementation where one is installed), whatever the parts they come in; the nonce counts."""
    from zeroboot_kernel.native import SPILL_ALIGN, Mac
    # checkpoint_spill restates the engine's constants (it is imported where the engine is not)
    assert (spill.ALIGN, spill.MAC_BYTES, spill.KEY_BYTES, len(spill.nonce(1))) == \
        (SPILL_ALIGN, Mac.TAG_BYTES, Mac.KEY_BYTES, Mac.NONCE_BYTES)
    key, data = os.urandom(32), os.urandom(3 * 4096 + 17)
    whole = Mac(key, spill.nonce(7))
    whole.update(data)
    tag = whole.digest()
    parts = Mac(key, spill.nonce(7))
    for at in range(0, len(data), 1000):
        parts.update(memoryview(data)[at:at + 1000])
    assert parts.digest() == tag and len(tag) == spill.MAC_BYTES
    other = Mac(key, spill.nonce(8))
    other.update(data)
    assert other.digest() != tag
    with pytest.raises(SandboxError, match="ended"):
        whole.update(b"x")
    with pytest.raises(SandboxError, match="key"):
        Mac(key[:16], spill.nonce(1))
    aead = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead")
    assert aead.AESGCM(key).encrypt(spill.nonce(7), b"", data) == tag


def test_the_disk_budget_holds_and_space_is_reused(tmp_path: Path) -> None:
    f = spill.SpillFile(tmp_path, 5 * MIB // 2)
    try:
        a = f.reserve(500, 256, 250)  # ~1 MiB each
        b = f.reserve(500, 256, 250)
        length = spill.aligned_length(500, 256, 250)
        assert a.length == b.length == length and a.offset % spill.ALIGN == b.offset % spill.ALIGN == 0
        assert not f.fits(length)
        with pytest.raises(spill.SpillError, match="disk budget"):
            f.reserve(500, 256, 250)
        f.free(a)
        c = f.reserve(500, 256, 250)
        assert c.offset == a.offset and f.end == b.offset + spill.span(b.length)  # the gap was reused
        f.free(b)
        f.free(c)
        assert f.end == 0 and os.fstat(f.fd).st_size == 0 and f.used == 0
    finally:
        f.close()
    assert os.listdir(tmp_path) == []  # an O_TMPFILE: never a name


def test_no_spill_file_is_left_after_a_killed_engine(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from zeroboot_kernel import checkpoint_spill as spill
        f = spill.SpillFile(Path({str(cache)!r}), 1 << 20)
        os.write(f.fd, b"x" * 4096)
        print(os.readlink(f"/proc/self/fd/{{f.fd}}"), flush=True)
        sys.stdin.read()
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline() if p.stdout else ""
        assert "(deleted)" in line or str(cache) in line, line
        assert os.listdir(cache) == []
    finally:
        p.kill()
        p.wait(timeout=60)
    assert os.listdir(cache) == []
    # a named leftover of the fallback whose process is gone is swept by the next session
    (cache / f"spill-{p.pid}-{'0' * 16}.tmp").write_bytes(b"old")
    (cache / f"spill-{os.getpid()}-{'1' * 16}.tmp").write_bytes(b"mine, alive")
    f = spill.SpillFile(cache, 1 << 20)
    try:
        assert f.removed_leftovers == [f"spill-{p.pid}-{'0' * 16}.tmp"]
        assert os.listdir(cache) == [f"spill-{os.getpid()}-{'1' * 16}.tmp"]
    finally:
        f.close()


def test_disk_setting_is_parsed() -> None:
    assert spill.from_env({spill.ENV: "4G"}) == 4 << 30
    assert spill.from_env({spill.ENV: "0"}) == 0
    assert spill.from_env({}) is None
    with pytest.raises(Exception, match=spill.ENV):
        spill.from_env({spill.ENV: "lots"})
    from zeroboot_kernel.kernel_config import KernelConfigError, KernelSettings
    with pytest.raises(KernelConfigError, match=spill.ENV):
        KernelSettings.from_env({spill.ENV: "lots"})


def _spill_fds(pid: int) -> list[str]:
    """The engine's open files in a spill folder (an O_TMPFILE reads as '<dir>/#123 (deleted)')."""
    out = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if "/spill/" in target:
                out.append(target)
    except OSError:
        pass
    return out


@pytest.mark.kvm
def test_spill_through_the_kernel_and_nothing_left_after_a_kill() -> None:
    """In the locked-down engine process: spilled checkpoints, listed, `%rewind 4` from disk, and
    the spill folder empty after the kernel is killed (the engine ends with it)."""
    import signal

    from kernel_helpers import engine_pid_of, execute, kernel, kernel_pid, stream_text, wait_until

    from zeroboot_kernel.template import cache_root

    with kernel("zeroboot", ZEROBOOT_CHECKPOINT_MEMORY="100M", ZEROBOOT_CHECKPOINT_DISK="1G",
                ZEROBOOT_CHECKPOINT_SPILL_BEHIND="wait") as (km, kc):
        folder = spill.spill_dir(cache_root())  # the tests' private cache (kernel_helpers)
        engine = engine_pid_of(km)
        assert execute(kc, "import numpy as np, hashlib")[0]["status"] == "ok"
        notices = []
        for n in range(2, 8):
            reply, msgs = execute(kc, CELL.format(n=n))
            assert reply["status"] == "ok"
            notices.append(stream_text(msgs, "stderr"))
        assert sum("written to disk" in t for t in notices) == 1, notices
        text = stream_text(execute(kc, "%sandbox checkpoints")[1])
        assert "on disk" in text and " disk " in text, text
        assert "checkpoints in memory / on disk" in stream_text(execute(kc, "%sandbox stats")[1])
        assert _spill_fds(engine) and not [n for n in os.listdir(folder) if n.startswith(f"spill-{engine}-")]
        reply, msgs = execute(kc, "%rewind 4")
        assert reply["status"] == "ok", msgs
        out = stream_text(execute(kc, "print(digest == hashlib.sha256(a.tobytes()).hexdigest(), a.size)")[1])
        assert out.split() == ["True", str(6 * 1024 * 1024)], out
        os.kill(kernel_pid(km), signal.SIGKILL)
        assert wait_until(lambda: not os.path.exists(f"/proc/{engine}"), 60)
    assert not [n for n in os.listdir(folder) if n.startswith(f"spill-{engine}-")]


def test_the_engine_refuses_hostile_page_records(template) -> None:
    """zb_snapshot_load_aligned checks the page index itself (as if the record's MAC did not exist):
    pages out of range or out of order, more records than the guest has pages, a count of stored
    pages other than the index's, contents cut short, a state cut short."""
    from zeroboot_kernel.native import Mac

    s = Session(template, checkpoint_disk=0)
    try:
        sfd, pfd = os.memfd_create("s"), os.memfd_create("p")
        s.clean.save_delta(sfd, pfd)
        state = os.pread(sfd, 1 << 30, 0)
        npages = os.stat(os.path.join(str(template.directory), "memory.img")).st_size // 4096
        contents = os.memfd_create("contents")
        os.write(contents, b"\x01" * 4096 * 4)

        def words(*records: tuple[int, bool]) -> bytes:
            return b"".join((index << 1 | zero).to_bytes(8, "little") for index, zero in records)

        def load(state_bytes: bytes, index: bytes, stored: int) -> None:
            mac = Mac(os.urandom(32), spill.nonce(1))
            s.clean.load_aligned(state_bytes, index, stored, contents, -1, 0, mac).release()

        for index, stored, why in ((words((npages, False)), 1, "names page"),
                                   (words((7, False), (7, True)), 1, "names page"),
                                   (words((9, False), (3, False)), 2, "names page"),
                                   (words((1, False), (2, True)), 2, "another number of pages"),
                                   (words((1, False), (2, False), (3, False), (4, False), (5, False)), 5, "truncated"),
                                   (b"\x00" * 8 * (npages + 1), 0, "more than the guest")):
            with pytest.raises(SandboxError, match=why):
                load(state, index, stored)
        with pytest.raises(SandboxError):
            load(state[: len(state) // 2], words((1, False)), 1)
        # the clean state's own page records (zb_snapshot_save_delta's: word, then the page unless zero)
        own, index, pages, pos = os.pread(pfd, 1 << 30, 0), [], os.memfd_create("own"), 0
        while pos < len(own):
            word = int.from_bytes(own[pos:pos + 8], "little")
            index.append(word)
            pos += 8
            if not word & 1:
                os.write(pages, own[pos:pos + 4096])
                pos += 4096
        stored = sum(not w & 1 for w in index)
        good = s.clean.load_aligned(state, b"".join(w.to_bytes(8, "little") for w in index), stored, pages, -1, 0,
                                    Mac(os.urandom(32), spill.nonce(2)))
        s.sandbox.restore(good)  # same lineage: restores in place
        good.release()
        assert run(s, "print(1 + 1)", 1)["stdout"].strip() == "2"
    finally:
        s.close()


def _one_writing(s: Session) -> Checkpoint:
    """With the spill writer held: cells of 48 MiB under a large budget, then a budget just under
    what the checkpoints hold, so that the oldest go to disk, all within what may be in flight at
    once (a spill beyond it would wait for the held writer). The one of them holding an `a`."""
    assert run(s, "import numpy as np, hashlib", 1)["status"] == "ok"
    for n in range(2, 6):
        assert run(s, CELL.format(n=n), n)["status"] == "ok"
    assert not any(cp.where() != "memory" for cp in s.checkpoints)
    spill.WRITER.hold()
    s.set_budget(s.checkpoint_memory() - 8 * MIB)
    writing = [cp for cp in s.checkpoints if cp.writing is not None]
    assert writing, [cp.where() for cp in s.checkpoints]
    return max(writing, key=lambda cp: cp.spilled.raw_bytes if cp.spilled else 0)  # the one holding an `a`


def _exact(s: Session, cp: Checkpoint) -> None:
    """The state is the one before cell cp.number: `a` is cell cp.number - 1's, byte for byte."""
    notes: list[str] = []  # the budget's notices (stderr)
    got = run(s, "print(hashlib.sha256(a.tobytes()).hexdigest(), digest)", 40, notes)["stdout"].split()
    expect = run(s, f"r = np.random.default_rng({cp.number - 1}).random(6 * 1024 * 1024); "
                    "print(hashlib.sha256(r.tobytes()).hexdigest())", 41, notes)["stdout"].split()
    assert got[0] == got[1] == expect[0], (got, expect)


def test_a_rewind_to_a_checkpoint_being_written_uses_its_memory(template) -> None:
    """The writer is held before its write (no timing involved): the checkpoint is "writing", the
    budget counts it as gone, its record cannot be read yet, and %rewind to it uses the memory copy
    exactly; the record's space is freed only once the write has ended."""
    s = Session(template, checkpoint_memory=4 << 30, checkpoint_disk=2 << 30, spill_waits=True)
    try:
        cp = _one_writing(s)
        assert s.spill is not None and cp.spilled is not None and cp.snapshot is not None
        info = s.describe_budget()
        assert info["writing"] == sum(c.writing is not None for c in s.checkpoints) >= 1
        assert info["writing_bytes"] > 40 * MIB and "being written" in info["where"]
        assert s.checkpoint_memory() <= s.budget_bytes()  # counted as gone while it is written
        with pytest.raises(spill.SpillError, match="still being written"):
            s.spill.load(cp.spilled, s.clean, s._memory_size())
        used = s.spill.used
        depth = len(s.checkpoints) - list(s.checkpoints).index(cp)
        msg = s.rewind(depth)
        assert f"before cell [{cp.number}]" in msg and "from disk" not in msg
        assert s.spill.used == used  # the orphaned record keeps its space while the writer may write it
        spill.WRITER.release()
        s._reap_spills(wait=True)
        assert s.spill.used == sum(spill.span(c.spilled.length) for c in s.checkpoints if c.spilled is not None) < used
        _exact(s, cp)
    finally:
        spill.WRITER.release()
        s.close()


def test_a_checkpoint_whose_write_ends_is_released_and_rewinds_from_disk(template) -> None:
    s = Session(template, checkpoint_memory=4 << 30, checkpoint_disk=2 << 30, spill_waits=True)
    try:
        cp = _one_writing(s)
        before = snapshots_held(s)
        spill.WRITER.release()
        s._reap_spills(wait=True)
        assert cp.where() == "disk" and cp.snapshot is None and cp.spilled is not None and not cp.spilled.pending
        assert snapshots_held(s) < before - 40 * MIB  # its memory went when the write ended
        depth = len(s.checkpoints) - list(s.checkpoints).index(cp)
        assert "from disk" in s.rewind(depth)
        _exact(s, cp)
    finally:
        spill.WRITER.release()
        s.close()


def snapshots_held(s: Session) -> int:
    """Bytes all of the session's snapshots hold, those being written included."""
    snaps = [cp.snapshot for cp in s.checkpoints if cp.snapshot is not None] + [s.clean]
    return snapshots_memory(snaps + [x for x in (s.ready, s.head) if x is not None])


def test_a_failed_write_drops_that_checkpoint(template) -> None:
    """A write that fails (the spill file's descriptor is read-only here) drops the checkpoint,
    says why, and frees its record's space."""
    s = Session(template, checkpoint_memory=4 << 30, checkpoint_disk=2 << 30, spill_waits=True)
    assert s.spill is not None
    good_fd, s.spill.fd = s.spill.fd, os.open("/dev/null", os.O_RDONLY)
    try:
        cp = _one_writing(s)
        spill.WRITER.release()
        s._reap_spills(wait=True)
        assert cp not in s.checkpoints and "spilling failed" in s.spill_reason
        assert s.spill.used == 0 and not [c for c in s.checkpoints if c.spilled is not None]
    finally:
        spill.WRITER.release()
        os.close(s.spill.fd)
        s.spill.fd = good_fd
        s.close()


@pytest.mark.parametrize("wait_s", [0.0, 0.3], ids=["drop", "bounded"])
def test_a_checkpoint_to_spill_while_the_writer_is_busy_is_dropped_as_a_gap(template, wait_s: float) -> None:
    """ZEROBOOT_CHECKPOINT_SPILL_BEHIND=drop, and the default (bounded) once its wait is over: with
    the writer held (busy), checkpoints that must leave memory beyond what may be in flight are
    dropped instead of waiting longer, so the next cells run while the writer is still held. Each
    leaves a gap: %rewind to it is refused, saying why and how far %rewind still goes, the others
    keep their depth and rewind exactly, and the user is told once."""
    import threading

    s = Session(template, checkpoint_memory=4 << 30, checkpoint_disk=2 << 30, spill_waits=None)
    s.spill_wait_s = wait_s  # the default's bound, shortened: the held writer never ends meanwhile
    try:
        notes: list[str] = []
        cp = _one_writing(s)  # the writer is held with spills in flight
        # a budget that pushes everything but the next cell's checkpoint out: beyond what may be in
        # flight, the rest cannot be written now
        s.set_budget(64 * MIB)
        # cells go on, each pushing its predecessor's checkpoint out, while the writer stays held
        # (were they to wait for it, they would never end: bounded by the join below)
        done: list[dict] = []
        worker = threading.Thread(target=lambda: done.extend(
            run(s, CELL.format(n=n), n, notes) for n in (6, 7)), daemon=True)
        worker.start()
        worker.join(600)
        assert not worker.is_alive() and [r["status"] for r in done] == ["ok", "ok"], "a cell waited for the writer"
        gaps = [c for c in s.checkpoints if c.where() == "dropped"]
        assert gaps and s.spill_gaps >= len(gaps) and cp.where() == "writing", [c.where() for c in s.checkpoints]
        assert s.checkpoints[0].where() != "dropped"  # the oldest entries are never gaps
        info = s.describe_budget()
        assert info["gaps"] == len(gaps) and "dropped while the disk writer was busy" in info["where"], info
        text = mg.format_checkpoints(s.describe_checkpoints(), s.mode, info)
        assert all(any(f"[{g.number}]" in line and " dropped " in line for line in text.splitlines()) for g in gaps), text
        told = [t for t in notes if "faster than their checkpoints could be written" in t]
        assert len(told) == 1 and spill.BEHIND_ENV in told[0], notes
        # %rewind to a gap is refused and changes nothing
        gap = gaps[0]
        depth_of = {c.number: len(s.checkpoints) - i for i, c in enumerate(s.checkpoints)}
        with pytest.raises(SandboxError, match=rf"before cell \[{gap.number}\] was dropped.*can still go back"):
            s.rewind(depth_of[gap.number])
        assert run(s, "print(int(a.size))", 30)["stdout"].strip() == str(6 * 1024 * 1024)
        # every other checkpoint keeps its depth: the one being written rewinds exactly
        depth_of = {c.number: len(s.checkpoints) - i for i, c in enumerate(s.checkpoints)}
        spill.WRITER.release()
        s._reap_spills(wait=True)
        assert cp.where() == "disk"
        msg = s.rewind(depth_of[cp.number])
        assert f"before cell [{cp.number}]" in msg and "from disk" in msg
        _exact(s, cp)
    finally:
        spill.WRITER.release()
        s.close()


def test_the_default_waits_for_a_writer_that_catches_up(template) -> None:
    """The default (bounded): a checkpoint that must leave memory while the writer is busy waits for
    it (its bound, generous here, is not reached), and once the writer goes on, every checkpoint is
    kept, in memory or on disk, with no gap; %rewind reaches them exactly."""
    import threading

    s = Session(template, checkpoint_memory=4 << 30, checkpoint_disk=2 << 30, spill_waits=None)
    assert s.spill_wait_s == spill.WAIT_BOUND_S
    s.spill_wait_s = 600.0
    try:
        cp = _one_writing(s)  # the writer is held with spills in flight
        done: list[dict] = []

        def cells() -> None:
            s.set_budget(64 * MIB)  # as in the test above: this and the next cells push checkpoints out
            done.extend(run(s, CELL.format(n=n), n) for n in (6, 7))

        worker = threading.Thread(target=cells, daemon=True)
        worker.start()
        worker.join(1.0)
        assert worker.is_alive(), "the cell did not wait for the held writer"
        spill.WRITER.release()
        worker.join(600)
        assert not worker.is_alive() and [r["status"] for r in done] == ["ok", "ok"]
        s._reap_spills(wait=True)
        where = [c.where() for c in s.checkpoints]
        assert "dropped" not in where and s.spill_gaps == 0 and where.count("disk") >= 3, where
        depth_of = {c.number: len(s.checkpoints) - i for i, c in enumerate(s.checkpoints)}
        assert "from disk" in s.rewind(depth_of[cp.number])
        _exact(s, cp)
    finally:
        spill.WRITER.release()
        s.close()


def test_spill_behind_setting_is_parsed() -> None:
    assert spill.wait_from_env({}) == spill.WAIT_BOUND_S == spill.wait_from_env({spill.BEHIND_ENV: "bounded"})
    assert spill.wait_from_env({spill.BEHIND_ENV: "drop"}) == 0
    assert spill.wait_from_env({spill.BEHIND_ENV: " Wait "}) == float("inf")
    with pytest.raises(BudgetSyntaxError, match="bounded, drop, wait"):
        spill.wait_from_env({spill.BEHIND_ENV: "sometimes"})


def test_an_idle_engine_releases_a_checkpoint_once_its_spill_is_written(template) -> None:
    """Between requests the engine server takes ended writes (Session.reap_spills), so an idle
    session does not hold a written checkpoint's memory until its next request."""
    import socket
    import threading
    import time

    from zeroboot_kernel import engine_wire as wire
    from zeroboot_kernel.engine_server import EngineServer

    s = Session(template, checkpoint_memory=4 << 30, checkpoint_disk=2 << 30, spill_waits=True)
    ours, theirs = socket.socketpair()
    thread = None
    try:
        cp = _one_writing(s)  # the writer is held: cp's write is in flight
        server = EngineServer(theirs, s)
        server.idle_release_s = 0
        thread = threading.Thread(target=lambda: _serve_quietly(server), daemon=True)
        thread.start()
        assert cp.where() == "writing" and s.spills_writing()
        spill.WRITER.release()
        deadline = time.monotonic() + 300  # polls for the write's end: no request is sent meanwhile
        while cp.where() != "disk" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cp.where() == "disk" and cp.snapshot is None, cp.where()
    finally:
        spill.WRITER.release()
        if thread is not None:
            wire.send(ours, {"op": "shutdown", "id": 1})
            thread.join(60)
        ours.close()
        theirs.close()
        s.close()


def _serve_quietly(server) -> None:
    try:
        server.serve()
    except SystemExit:
        pass


def test_a_spilled_checkpoint_keeps_its_lost_children(template) -> None:
    """A checkpoint taken while a child process lived leaves it out (Snapshot.lost_children); its
    record on disk carries that list, so a %rewind to it from disk gives the child back as a zombie
    killed by SIGKILL, as one from memory does."""
    s = Session(template, checkpoint_memory=120 * MIB, checkpoint_disk=2 << 30, spill_waits=True)
    try:
        assert run(s, "import numpy as np, hashlib, subprocess\np = subprocess.Popen(['sleep', '600'])", 1)["status"] == "ok"
        for n in range(2, 7):
            assert run(s, CELL.format(n=n), n)["status"] == "ok"
        numbers = [cp.number for cp in s.checkpoints]
        second = numbers.index(2)  # before cell 2: the child lived
        assert s.checkpoints[second].where() == "disk", [cp.where() for cp in s.checkpoints]
        msg = s.rewind(len(s.checkpoints) - second)
        assert "before cell [2]" in msg and "from disk" in msg and "did not come back" in msg, msg
        assert run(s, "print(p.wait())", 20)["stdout"] == "-9\n"
        assert s.sandbox.guest.child_processes() == 0
    finally:
        s.close()
