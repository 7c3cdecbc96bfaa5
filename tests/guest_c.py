"""Build and run the C guest programs of tests/guest_programs/ in fresh sandboxes.

The programs are static binaries (gcc -static -O1) run without CPython, TinyKVM-style, so each
test looks at one syscall's answer. Binaries are cached in tests/.guest-bin/ under a hash of their
sources and the compiler flags; the guest sees that directory read-only (the view), a private /tmp
and home directory, and has 256 MiB of memory.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from zeroboot_kernel.native import Event, EventKind, Guest, Snapshot
from zeroboot_kernel.guest_view import GuestSpec

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "guest_programs"
BIN_DIR = HERE / ".guest-bin"
CFLAGS = ["-static", "-O1", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror"]
GUEST_MEM = 256 << 20
STOPPING = {EventKind.EXIT, EventKind.FAULT, EventKind.ERROR, EventKind.TIMEOUT, EventKind.INPUT}


def have_gcc() -> bool:
    return shutil.which("gcc") is not None


def build(name: str, sources: Path = SOURCES) -> Path:
    """The static binary of SOURCES/NAME.c (guest_programs/ by default; tests/security/guest/
    for the escape battery), compiled once per content hash. check.h is always on the path."""
    src = sources / f"{name}.c"
    digest = hashlib.sha256()
    for part in [src, *sorted(SOURCES.glob("*.h")), *sorted(sources.glob("*.h"))]:
        digest.update(part.name.encode() + b"\0" + part.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    out = BIN_DIR / f"{name}-{digest.hexdigest()[:16]}"
    if out.exists():
        return out
    BIN_DIR.mkdir(exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    proc = subprocess.run(["gcc", *CFLAGS, f"-I{SOURCES}", f"-I{sources}", "-o", str(tmp), str(src)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"gcc failed for {src}:\n{proc.stderr}")
    os.replace(tmp, out)  # atomic: concurrent test runs never see a half-written binary
    return out


def spec(binary: Path, args: list[str], *, mem: int = GUEST_MEM, view: list[str] | None = None) -> GuestSpec:
    return GuestSpec(exe=str(binary), argv=[str(binary), *args], env={"PATH": "/usr/bin:/bin", "HOME": "/home/sandbox"},
                     view=[str(binary.parent), *(view or [])], mem_bytes=mem)


def boot(name: str, *args: str, sources: Path = SOURCES, **kw) -> Guest:
    return Guest.boot(spec(build(name, sources), list(args), **kw))


@dataclass
class GuestRun:
    """How a guest program ended and what it printed."""

    end: Event
    stdout: bytes = b""
    stderr: bytes = b""
    events: list[Event] = field(default_factory=list)

    @property
    def kind(self) -> EventKind:
        return self.end.kind

    @property
    def status(self) -> int:
        return self.end.status

    @property
    def out(self) -> str:
        return self.stdout.decode(errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode(errors="replace")

    def describe(self) -> str:
        return (f"ended with {self.end.kind.name} status={self.end.status} signal={self.end.signal} "
                f"message={self.end.message!r}\n--- stdout ---\n{self.out}\n--- stderr ---\n{self.err}")


def drive(sb: Guest, timeout: float = 30.0) -> GuestRun:
    """Run sb until it exits, crashes, breaks a rule or times out, collecting its output."""
    deadline = time.monotonic() + timeout
    run = GuestRun(end=Event(EventKind.TIMEOUT))
    out, err = bytearray(), bytearray()  # (bytes += bytes is quadratic for floods of output)
    while True:
        ev = sb.run(deadline)
        run.events.append(ev)
        if ev.kind is EventKind.OUTPUT:
            (out if ev.stream == 1 else err).extend(ev.data)
        elif ev.kind in STOPPING:
            run.end, run.stdout, run.stderr = ev, bytes(out), bytes(err)
            return run


def run(name: str, *args: str, timeout: float = 30.0, **kw) -> GuestRun:
    """Boot guest_programs/NAME with ARGS in a fresh sandbox and run it to its end."""
    with boot(name, *args, **kw) as sb:
        return drive(sb, timeout)


def check(name: str, test: str, *args: str, **kw) -> GuestRun:
    """Run one named test of a guest program; it must exit 0 having printed PASS."""
    result = run(name, test, *args, **kw)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert f"PASS {test}" in result.out, result.describe()
    return result


def check_on_linux(name: str, test: str) -> None:
    """Run one named test of guest_programs/NAME on the host itself: the program's checks are then
    Linux's behaviour, not the engine's."""
    proc = subprocess.run([str(build(name)), test], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and f"PASS {test}" in proc.stdout, proc.stderr


def check_state_survives_snapshots(name: str, tmp_path: Path) -> None:
    """NAME's `snapshot_state` test: the program sets up its state, prints "ready" and waits for
    input; it is snapshotted, the snapshot saved and loaded, and three forks (two of one snapshot,
    so they must not share that state, and one of the loaded copy) each check it and print PASS."""
    with boot(name, "snapshot_state") as sb:
        ev = sb.run(time.monotonic() + 10)
        assert ev.kind is EventKind.OUTPUT and b"ready" in ev.data, ev
        assert sb.run(time.monotonic() + 10).kind is EventKind.INPUT
        snap = sb.snapshot()
        (tmp_path / "saved").mkdir()
        snap.save(str(tmp_path / "saved"))
        loaded = Snapshot.load(str(tmp_path / "saved"))
        for source in (snap, snap, loaded):
            with source.fork() as child:
                child.push_input(b"go")
                result = drive(child)
            assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
            assert "PASS snapshot_state" in result.out
