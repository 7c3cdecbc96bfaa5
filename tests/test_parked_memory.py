"""Parked memory (native/snapshot.c): a freed sandbox's memory that an executor VM still maps is
kept, and the next fork of its lineage takes it, made equal to the snapshot in place, so that the
fork keeps KVM's shadow page tables. What it must never do: show the new fork anything of the
old sandbox. Each test reads the old sandbox's data back at the addresses where it was (guest
memory is identity-mapped and present, so the guest can read any address above its low region)
and checks on the host that nothing of it is there."""
from __future__ import annotations

import ast
import binascii
import os
from collections.abc import Iterator

import pytest

from zeroboot_kernel.native import Engine
from zeroboot_kernel.sandbox import Sandbox
from zeroboot_kernel.template import Template

# Prints the addresses of a ~3 MiB bytearray (its own mmap) and of 200 small bytes objects (the
# interpreter's heap), all full of MARK, and leaves the marker in globals, the environment and /tmp.
WRITE_MARKER = """
import ctypes, os
big = bytearray({mark!r} * (3 * 2**20 // len({mark!r})))
small = [{mark!r} * 40 + str(i).encode() for i in range(200)]
base = ctypes.addressof((ctypes.c_char * len(big)).from_buffer(big))
addrs = [base + k for k in range(0, len(big) - 64, 1 << 16)] + [id(s) + 32 for s in small]
os.environ['ZB_PARKED_MARK'] = {text!r}
with open('/tmp/zb-parked-mark', 'w') as f: f.write({text!r})
secret = {text!r}
print(addrs)
"""

# Prints, as hex, 64 bytes at each address (read before anything else is allocated), then what the
# fork sees of the marker's other traces. Contains no marker itself.
PROBE = """
import ctypes, os
_addrs = {addrs!r}
_seen = [ctypes.string_at(a, 64) for a in _addrs]
print(b''.join(_seen).hex())
print('secret' in globals(), 'ZB_PARKED_MARK' in os.environ, os.path.exists('/tmp/zb-parked-mark'))
"""


def _mark() -> tuple[bytes, str]:
    text = "zb-parked-" + binascii.hexlify(os.urandom(8)).decode()
    return text.encode(), text


def _taken(engine: Engine) -> int:
    return engine.parking_stats()["taken"]


def _probe(sb: Sandbox, addrs: list[int]) -> tuple[bytes, str]:
    r = sb.execute(PROBE.format(addrs=addrs))
    assert r.status == "ok", r.error
    seen_hex, traces = r.stdout.split()[0], " ".join(r.stdout.split()[1:])
    return bytes.fromhex(seen_hex), traces


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine.default()
    e.set_parking(True)
    yield e
    e.set_parking(True)


def test_a_fork_that_takes_parked_memory_sees_nothing_of_the_sandbox_before(template: Template, engine: Engine) -> None:
    mark, text = _mark()
    with template.fork() as first:
        r = first.execute(WRITE_MARKER.format(mark=mark, text=text))
        assert r.status == "ok", r.error
        addrs = ast.literal_eval(r.stdout.strip())
        seen, _ = _probe(first, addrs)
        assert seen.count(mark) >= len(addrs) // 2, "the probe does not see the marker where it was written"
    taken = _taken(engine)
    with template.fork() as second:
        assert _taken(engine) == taken + 1, "the fork did not take the freed sandbox's memory"
        seen, traces = _probe(second, addrs)
        assert mark not in seen
        assert traces == "False False False"
        # and it runs as any fork does
        assert second.execute("import numpy; print(int(numpy.arange(10).sum()))").stdout.strip() == "45"


def test_children_take_their_predecessors_memory_and_see_only_their_parent(template: Template, engine: Engine) -> None:
    """Child processes forked one after the other: each takes the one before's memory (parked on
    its executor) and sees its parent's state, never the previous child's."""
    mark, _ = _mark()
    code = f"""
import ctypes, os
g = 'parent'
seen = []
prev = []
for i in range(6):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        probe = b''.join(ctypes.string_at(a, 64) for a in prev)
        big = bytearray({mark!r} * (2**20 // len({mark!r})))
        small = [{mark!r} * 40 + str(k).encode() for k in range(50)]
        base = ctypes.addressof((ctypes.c_char * len(big)).from_buffer(big))
        addrs = [base + k for k in range(0, len(big) - 64, 1 << 15)] + [id(s) + 32 for s in small]
        os.write(w, repr((g, probe.hex(), addrs)).encode())
        g = 'child'
        os._exit(0)
    os.close(w)
    data = b''
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    got_g, probe_hex, prev = eval(data)
    seen.append((got_g, probe_hex))
print(repr(seen))
"""
    with template.fork() as sb:
        taken = _taken(engine)
        r = sb.execute(code)
        assert r.status == "ok", r.error
        seen = ast.literal_eval(r.stdout.strip())
        assert [g for g, _ in seen] == ["parent"] * 6
        for _, probe_hex in seen[1:]:
            assert mark not in bytes.fromhex(probe_hex)
        assert _taken(engine) - taken >= 5, "the children did not take their predecessors' memory"


# A program exec'd in a child (a Python) writes the marker into ~3 MiB and into its heap and prints
# the addresses; then a forked child of the notebook, which takes that memory (parked), reads them
# back and checks the parent's data. Contains no marker itself.
EXEC_THEN_FORK = """
import ast, ctypes, hashlib, os, subprocess, sys
data = bytes(range(256)) * 4096
want = hashlib.sha256(data).hexdigest()
out = subprocess.run([sys.executable, '-c', {write!r}], capture_output=True, text=True, check=True).stdout
addrs = ast.literal_eval(out.strip().splitlines()[-1])
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    probe = b''.join(ctypes.string_at(a, 64) for a in addrs)
    os.write(w, repr((probe.hex(), hashlib.sha256(data).hexdigest())).encode())
    os._exit(0)
os.close(w)
got = b''
while chunk := os.read(r, 1 << 16):
    got += chunk
os.waitpid(pid, 0)
probe_hex, seen = ast.literal_eval(got.decode())
print(repr((len(addrs), probe_hex, seen == want)))
"""


def test_an_exec_ed_child_s_memory_serves_the_next_fork_and_shows_it_nothing(template: Template,
                                                                          engine: Engine) -> None:
    """An execve lets go of the old program's pages without zeroing them (memory.h zb_mem_drop), so
    an exec'd child's memory is the lineage's except what the new program wrote, and is parked: the
    next fork takes it, made equal to the parent's snapshot. Nothing the exec'd program wrote shows."""
    mark = binascii.hexlify(os.urandom(8))
    write = WRITE_MARKER.format(mark=mark, text=mark.decode())
    with template.fork() as sb:
        taken = _taken(engine)
        r = sb.execute(EXEC_THEN_FORK.format(write=write))
        assert r.status == "ok", r.error
        n, probe_hex, same = ast.literal_eval(r.stdout.strip().splitlines()[-1])
        assert n > 200 and same, "the fork after the exec'd child did not see the parent's data"
        assert mark not in bytes.fromhex(probe_hex)
        assert _taken(engine) - taken >= 1, "the fork did not take the exec'd child's memory"
        # a run of exec'd children: each takes the one before's memory
        taken = _taken(engine)
        r = sb.execute("import subprocess\nfor _ in range(3): subprocess.run(['true'], check=True)")
        assert r.status == "ok", r.error
        assert _taken(engine) - taken >= 3


def test_parking_off(template: Template, engine: Engine) -> None:
    engine.set_parking(False)
    taken = _taken(engine)
    for _ in range(2):
        with template.fork() as sb:
            assert sb.execute("print(1)").stdout.strip() == "1"
    assert _taken(engine) == taken


def test_a_child_that_wrote_much_gives_its_memory_back(template: Template, engine: Engine) -> None:
    """Parked memory is bounded (64 MiB of a memory's own pages): a child that wrote 80 MiB is
    not parked, so the child after it finds nothing to take."""
    child = ("import os\n"
             "def child(n):\n"
             "    pid = os.fork()\n"
             "    if pid == 0:\n"
             "        data = bytearray(b'x' * n)\n"
             "        os._exit(0)\n"
             "    os.waitpid(pid, 0)\n"
             "child(1 << 20)\n")
    with template.fork() as sb:
        assert sb.execute(child).status == "ok"  # a small child: parked
        taken = _taken(engine)
        r = sb.execute("child(80 << 20)\nchild(1 << 20)")
        assert r.status == "ok", r.error
        assert _taken(engine) == taken + 1, "the big child was parked (or the small one's memory was not taken)"


def test_forks_of_a_held_snapshot_with_much_data_take_each_others_memory(template: Template, engine: Engine) -> None:
    """The bound counts a base's data only when the parked memory would hold its last reference:
    forks of a snapshot someone else holds (a fan-out's jobs, children of a session with 100 MiB of
    data) are parked however much data the snapshot has."""
    with template.fork() as sb:
        assert sb.execute("data = bytearray(b'x' * (100 << 20))").status == "ok"
        snap = sb.snapshot()
        try:
            taken = _taken(engine)
            for _ in range(3):
                with Sandbox(snap.fork(), template, fresh=False) as job:
                    assert job.execute("print(len(data))").stdout.strip() == str(100 << 20)
            assert _taken(engine) - taken >= 2, "the forks did not take each other's memory"
        finally:
            snap.release()


def test_a_closing_sandbox_whose_base_holds_much_data_is_not_parked(template: Template, engine: Engine) -> None:
    """A sandbox that holds the last reference to a base with 100 MiB of data would keep that data
    alive while parked: it is freed instead."""
    sb = template.fork()
    assert sb.execute("data = bytearray(b'x' * (100 << 20))").status == "ok"
    # its base holds the data now, and only the sandbox holds its base; three snapshots that find
    # the data unchanged get its part of the unlogged window logged, so that the data no longer
    # counts as written since the base (ARCHITECTURE.md section 4)
    for _ in range(3):
        sb.snapshot().release()
    assert sb.execute("x = 1").status == "ok"
    sb.close()
    taken = _taken(engine)
    with template.fork() as other:
        assert other.execute("print(1)").stdout.strip() == "1"
    assert _taken(engine) == taken
