"""Low-level binding of the fork engine (native/, through cffi): engines, guests, snapshots.

    engine = Engine.default()
    guest = Guest.boot(python_spec(["-c", "print(1)"]), engine)
    while (ev := guest.run()).kind is EventKind.OUTPUT: ...

An Engine and its guests belong to one thread at a time (the engine owns one executor VM);
only Guest.kick() may be called from another thread. The notebook-level API (templates,
sandboxes that execute cells) is in zeroboot_kernel.engine.
"""
from __future__ import annotations

import enum
import ipaddress
import logging
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from . import listing
from .errors import KvmUnavailableError, SandboxError
from .guest_view import GuestSpec
from .network_policy import NetworkPolicy

log = logging.getLogger(__name__)

MAX_LISTING = 64 << 20   # one directory listing or diff from the engine
READ_CHUNK = 1 << 20     # one read of a guest file for the host side

try:
    from ._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError("zeroboot_kernel._native is not built: run `pip install -e .` (or ./setup.sh) "
                      "in the zeroboot-kernel checkout") from exc

PAGE_SIZE = 4096                  # a guest page (ZB_PAGE)
SPILL_ALIGN = lib.ZB_SPILL_ALIGN  # where a spill record and its page contents start (zb_spill_write)


class EventKind(enum.IntEnum):
    EXIT = lib.ZB_EVENT_EXIT
    FAULT = lib.ZB_EVENT_FAULT
    OUTPUT = lib.ZB_EVENT_OUTPUT
    FRAME = lib.ZB_EVENT_FRAME
    INPUT = lib.ZB_EVENT_INPUT
    TIMEOUT = lib.ZB_EVENT_TIMEOUT
    KICK = lib.ZB_EVENT_KICK
    ERROR = lib.ZB_EVENT_ERROR


@dataclass(frozen=True)
class Event:
    """Why a run stopped. `data` is a copy (stream bytes or frame payload)."""

    kind: EventKind
    status: int = 0
    signal: int = 0
    stream: int = 0
    frame_type: int = 0
    data: bytes = b""
    rip: int = 0
    addr: int = 0
    message: str = ""
    timed: bool = False  # INPUT: the guest's wait ends at a timeout of its own (work to do by then)


def _err() -> Any:
    return ffi.new("char[]", lib.ZB_ERRLEN)


def _text(buf: Any) -> str:
    return ffi.string(buf).decode(errors="replace")


class Engine:
    """The process's handle on /dev/kvm and its executor VM."""

    _default: Engine | None = None
    _default_lock = threading.Lock()

    def __init__(self) -> None:
        err = _err()
        handle = lib.zb_engine_open(err)
        if handle == ffi.NULL:
            raise KvmUnavailableError(_text(err))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.zb_engine_close, handle)

    @classmethod
    def default(cls) -> Engine:
        """A shared engine for this process (created on first use)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    @property
    def handle(self) -> Any:
        return self._handle

    def set_syscall_path(self, sync_regs: bool = True, direct_entry: bool = True,
                         guest_answers: bool = True, site_rewrite: bool = True) -> tuple[bool, bool, bool, bool]:
        """How syscalls reach the host and return (zb_engine_set_syscall_path; all on by default,
        off for measurements): registers through kvm_run rather than ioctls, LSTAR at the syscall
        entry page rather than a page fault into the CPL0 stub, getpid/getuid/getgid (and the
        effective ids, and the other answers of guest_abi.h) answered by the entry page in the
        guest without an exit (PVM hosts only, with the direct entry), and `syscall` instructions
        that exited rewritten into the port's `out` (sites rewritten before stay so). Returns what
        is in effect, in that order."""
        flags = ((lib.ZB_SYSCALLS_SYNC_REGS if sync_regs else 0) | (lib.ZB_SYSCALLS_DIRECT_ENTRY if direct_entry else 0)
                 | (lib.ZB_SYSCALLS_GUEST_ANSWERS if guest_answers else 0)
                 | (lib.ZB_SYSCALLS_SITE_REWRITE if site_rewrite else 0))
        got = int(lib.zb_engine_set_syscall_path(self._handle, flags))
        if got < 0:
            raise SandboxError("cannot change the syscall path of the executor VM (KVM_SET_MSRS or KVM_SET_REGS failed)")
        return (bool(got & lib.ZB_SYSCALLS_SYNC_REGS), bool(got & lib.ZB_SYSCALLS_DIRECT_ENTRY),
                bool(got & lib.ZB_SYSCALLS_GUEST_ANSWERS), bool(got & lib.ZB_SYSCALLS_SITE_REWRITE))

    def set_parking(self, on: bool) -> None:
        """Whether a freed sandbox's memory is kept for the next fork of its lineage (on by
        default, zb_engine_set_parking): such a fork keeps KVM's shadow page tables of it. Off gives
        back what is parked (for measurements and tests)."""
        lib.zb_engine_set_parking(self._handle, 1 if on else 0)

    def release_parked(self) -> None:
        """Give back the memory of freed sandboxes kept for the next fork (an idle engine)."""
        lib.zb_engine_release_parked(self._handle)

    def parking_stats(self) -> dict[str, int]:
        """Forks that took a parked memory, and parked memories given back unused."""
        taken, dropped = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        lib.zb_engine_parking_stats(self._handle, taken, dropped)
        return {"taken": int(taken[0]), "dropped": int(dropped[0])}

    def lockdown(self, phase: str) -> None:
        """seccomp on this whole process (native/seccomp.c), irreversibly: "setup" (no exec, no
        network, no new processes) or "run" (also no host file writes)."""
        err = _err()
        code = {"setup": lib.ZB_LOCKDOWN_SETUP, "run": lib.ZB_LOCKDOWN_RUN}[phase]
        if lib.zb_engine_lockdown(self.handle, code, err) < 0:
            raise SandboxError(_text(err))

    def set_network(self, policy: NetworkPolicy | None) -> None:
        """Install the network egress policy for every sandbox of this engine (None or an empty
        policy: no network). Call it before lockdown(): the seccomp filters allow the socket calls
        only if a policy is installed then."""
        if policy is None or not policy.enabled:
            lib.zb_engine_set_network(self.handle, ffi.NULL)
            return
        net = lib.zb_net_new()
        if net == ffi.NULL:
            raise MemoryError("out of memory for the network policy")
        err = _err()
        kinds = {"name": lib.ZB_NET_NAME, "suffix": lib.ZB_NET_SUFFIX}
        try:
            for rule in policy.rules:
                if rule.network is not None:
                    kind = lib.ZB_NET_CIDR4 if rule.network.version == 4 else lib.ZB_NET_CIDR6
                    rc = lib.zb_net_allow(net, kind, ffi.NULL, rule.network.network_address.packed,
                                          rule.network.prefixlen, rule.port, err)
                else:
                    rc = lib.zb_net_allow(net, kinds[rule.kind], rule.name.encode(), ffi.NULL, 0, rule.port, err)
                if rc < 0:
                    raise SandboxError(f"network rule {rule.text()}: {_text(err)}")
            for name, address in policy.hosts:
                addr = ipaddress.ip_address(address)
                family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
                if lib.zb_net_add_host(net, name.encode(), family, addr.packed, err) < 0:
                    raise SandboxError(f"network host {name}={address}: {_text(err)}")
            if lib.zb_net_set_limits(net, policy.max_connections, policy.rate, err) < 0:
                raise SandboxError(f"network limits: {_text(err)}")
            if policy.resolver:
                ip = ipaddress.ip_address(policy.resolver[0])
                family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
                if lib.zb_net_set_resolver(net, family, ip.packed, policy.resolver[1], err) < 0:
                    raise SandboxError(f"network resolver {policy.resolver}: {_text(err)}")
        except BaseException:
            lib.zb_net_free(net)
            raise
        lib.zb_engine_set_network(self.handle, net)

    def network_stats(self) -> dict[str, int]:
        """The installed policy's counters (zb_net_stats; zeros without a policy)."""
        st = ffi.new("zb_net_stats *")
        lib.zb_engine_network_stats(self.handle, st)
        return {name: int(getattr(st, name)) for name in ("connects", "refused", "dns_queries", "dns_answers",
                                                           "dns_refused", "dns_host_lookups", "bytes_sent",
                                                           "bytes_received", "over_connection_limit",
                                                           "throttled_ns", "dns_host_timeouts")}

    def close(self) -> None:
        self._finalizer()


def _cstrings(items: list[str]) -> tuple[Any, list[Any]]:
    keep = [ffi.new("char[]", s.encode()) for s in items]
    return ffi.new("char*[]", keep + [ffi.NULL]), keep


class Guest:
    """A sandbox (C zb_sandbox): a guest program's memory, vCPU state and engine-side state. Not
    the Python Sandbox, which is one of these running the guest agent (docs/ARCHITECTURE.md,
    Glossary). Use as a context manager."""

    def __init__(self, engine: Engine, handle: Any) -> None:
        self.engine = engine
        self._handle = handle
        self._event = ffi.new("zb_event *")
        self._finalizer = weakref.finalize(self, lib.zb_sandbox_free, handle)

    @classmethod
    def boot(cls, spec: GuestSpec, engine: Engine | None = None, trace_fd: int | None = None) -> Guest:
        """A new sandbox running spec.exe from its first instruction."""
        engine = engine or Engine.default()
        err = _err()
        handle = lib.zb_sandbox_new(engine.handle, spec.mem_bytes, err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        sb = cls(engine, handle)
        for path in spec.view:
            if lib.zb_sandbox_view_add(handle, path.encode(), err) < 0:
                log.warning("not visible in the guest: %s", _text(err))
        for path in spec.overlay_dirs:
            if lib.zb_sandbox_overlay_dir(handle, path.encode(), err) < 0:
                raise SandboxError(_text(err))
        for path, data in spec.files.items():
            if lib.zb_sandbox_put_file(handle, path.encode(), data, len(data), err) < 0:
                raise SandboxError(_text(err))
        if spec.memory_limit:
            lib.zb_sandbox_set_memory_limit(handle, spec.memory_limit)
        if trace_fd is not None:
            lib.zb_sandbox_set_trace_fd(handle, trace_fd)
        argv, _k1 = _cstrings(spec.argv)
        envp, _k2 = _cstrings([f"{k}={v}" for k, v in spec.env.items()])
        if lib.zb_sandbox_exec(handle, spec.exe.encode(), spec.cwd.encode(), argv, envp, err) < 0:
            raise SandboxError(_text(err))
        return sb

    @property
    def handle(self) -> Any:
        if not self._finalizer.alive:
            raise SandboxError("this sandbox has been closed")
        return self._handle

    def run(self, deadline: float | None = None) -> Event:
        """Run until the next event. `deadline` is a time.monotonic() value."""
        ev = self._event
        lib.zb_sandbox_run(self.handle, int(deadline * 1e9) if deadline else 0, ev)
        self._drain_log()
        data = bytes(ffi.buffer(ev.data, ev.len)) if ev.len else b""
        return Event(EventKind(ev.kind), ev.status, ev.signal, ev.stream, ev.frame_type, data, ev.rip, ev.addr,
                     _text(ev.message), bool(ev.timed))

    def push_input(self, data: bytes) -> None:
        err = _err()
        if lib.zb_sandbox_push_input(self.handle, data, len(data), err) < 0:
            raise SandboxError(_text(err))

    def kick(self) -> None:
        """Make a run() on another thread return EventKind.KICK soon."""
        lib.zb_sandbox_kick(self.handle)

    def raise_signal(self, signo: int) -> None:
        """Deliver a signal to the guest's handler when it next runs."""
        err = _err()
        if lib.zb_sandbox_raise(self.handle, signo, err) < 0:
            raise SandboxError(_text(err))

    def test_break_in_trap(self, vector: int) -> None:
        """Test hook: stop the next run (KICK) when exception `vector` (0-31) has entered its CPL0
        stub, or (SYSCALL_ENTRY_BREAK = 32) a syscall has reached the entry's `out`, before the
        host has seen it (not the syscalls the entry answers in the guest)."""
        err = _err()
        if lib.zb_sandbox_test_break_in_trap(self.handle, vector, err) < 0:
            raise SandboxError(_text(err))

    def cancel_alarm(self) -> bool:
        """Disarm the guest's alarm()/setitimer(ITIMER_REAL) timer; True if one was armed."""
        return bool(lib.zb_sandbox_cancel_alarm(self.handle))

    @property
    def finished(self) -> bool:
        return bool(lib.zb_sandbox_finished(self.handle))

    def stats(self) -> dict[str, int]:
        st = ffi.new("zb_stats *")
        lib.zb_sandbox_stats(self.handle, st)
        return {name: getattr(st, name) for name in dir(st)}

    def set_profile(self, on: bool) -> None:
        """Stamp every syscall's phases (switching it on clears the counts); off costs nothing."""
        lib.zb_sandbox_set_profile(self.handle, 1 if on else 0)

    def set_input_yields(self, on: bool) -> None:
        """Between requests: a UART read with no input lets the guest's other threads run instead of
        stopping for INPUT at once (zb_sandbox_set_input_yields); off during requests."""
        lib.zb_sandbox_set_input_yields(self.handle, 1 if on else 0)

    def set_max_threads(self, n: int) -> None:
        """The most guest threads alive at once (1..1024; clone past it fails with EAGAIN)."""
        if lib.zb_sandbox_set_max_threads(self.handle, n) < 0:
            raise ValueError(f"a thread limit must be between 1 and 1024, not {n}")

    def set_max_processes(self, n: int) -> None:
        """The most processes of this sandbox's family at once (1..1024; fork past it: EAGAIN)."""
        if lib.zb_sandbox_set_max_processes(self.handle, n) < 0:
            raise ValueError(f"a process limit must be between 1 and 1024, not {n}")

    def process_count(self) -> int:
        """The processes of this sandbox's family alive now (1: no child processes)."""
        return int(lib.zb_sandbox_process_count(self.handle))

    def child_processes(self) -> int:
        """Its child processes, zombies (exited, not waited for) included: a snapshot is refused
        while there are any."""
        return int(lib.zb_sandbox_child_count(self.handle))

    def listening_sockets(self) -> int:
        """The listening sockets (AF_UNIX, loopback TCP) of process 1 (a snapshot holds them, but fails while a
        connection waits in one's accept queue)."""
        return int(lib.zb_sandbox_listening_sockets(self.handle))

    def listeners_waiting(self) -> int:
        """Of the listening sockets, those with a connection waiting to be accepted (while any is, snapshot() fails)."""
        return int(lib.zb_sandbox_listeners_waiting(self.handle))

    def fds_in_flight(self) -> int:
        """File references sent over the family's AF_UNIX sockets (SCM_RIGHTS) and not received
        yet (while there are any, snapshot() fails)."""
        return int(lib.zb_sandbox_fds_in_flight(self.handle))

    @staticmethod
    def child_processes_alive() -> int:
        """Child-process sandboxes alive in this process, over all families (leak checks)."""
        return int(lib.zb_child_processes_alive())

    def syscall_profile(self) -> dict[str, int]:
        """Cumulative ns per phase of the syscalls served while profiling (see zb_syscall_profile)."""
        p = ffi.new("zb_syscall_profile *")
        lib.zb_sandbox_profile(self.handle, p)
        return {name: getattr(p, name) for name in dir(p)}

    def syscall_profile_by_number(self) -> dict[str, dict[str, int]]:
        """The profile per syscall (by Linux name; numbers 511 and above share one row): calls,
        exit_ns (KVM_RUN to the handler), dispatch_ns, host_calls, return_ns."""
        rows = ffi.new("zb_syscall_nr_profile[]", lib.ZB_PROFILE_NRS)
        n = min(int(lib.zb_sandbox_profile_syscalls(self.handle, rows, lib.ZB_PROFILE_NRS)), lib.ZB_PROFILE_NRS)
        out: dict[str, dict[str, int]] = {}
        for r in rows[0:n]:
            name = ffi.string(lib.zb_sandbox_syscall_name(r.nr)).decode()
            out[name if name != "unknown" else f"syscall {r.nr}"] = {
                "nr": r.nr, "calls": r.calls, "exit_ns": r.exit_ns, "dispatch_ns": r.dispatch_ns,
                "host_calls": r.host_calls, "return_ns": r.return_ns}
        return out

    def _drain_log(self) -> None:
        buf = ffi.new("char[]", 8192)
        n = lib.zb_sandbox_take_log(self._handle, buf, 8192)
        for line in ffi.buffer(buf, n)[:].decode(errors="replace").splitlines():
            log.info("guest: %s", line)

    def close(self) -> None:
        self._finalizer()

    def snapshot(self) -> Snapshot:
        """Capture the guest's current state; the guest goes on unchanged. Refused while it has
        child processes (checkpoint() allows them)."""
        err = _err()
        handle = lib.zb_sandbox_snapshot(self.handle, err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        return Snapshot(self.engine, handle)

    def checkpoint(self) -> Snapshot:
        """A rollback point of process 1: a snapshot that allows child processes, which its
        restore ends (Snapshot.lost_children: those process 1 then sees killed)."""
        err = _err()
        handle = lib.zb_sandbox_checkpoint(self.handle, err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        return Snapshot(self.engine, handle)

    def pending_bytes(self) -> int:
        """At most how many bytes of pages the next snapshot would store (written since the last)."""
        err = _err()
        n = int(lib.zb_sandbox_pending_bytes(self.handle, err))
        if n < 0:
            raise SandboxError(_text(err))
        return n

    def release_template_copies(self) -> int:
        """Give back the host's private copies of pages that hold the template's bytes again
        (zb_sandbox_release_template_copies): what an idle live sandbox costs drops to the pages
        its cells changed. The guest reads the same bytes; its next write to one re-copies it.
        Returns the pages given back."""
        err = _err()
        n = int(lib.zb_sandbox_release_template_copies(self.handle, err))
        if n < 0:
            raise SandboxError(_text(err))
        return n

    def release_freed(self) -> int:
        """Give back the freed memory kept mapped for reuse (zb_sandbox_release_freed): nothing the
        guest or a snapshot sees changes; its next big allocation gets fresh pages instead. Returns
        the pages given back."""
        err = _err()
        n = int(lib.zb_sandbox_release_freed(self.handle, err))
        if n < 0:
            raise SandboxError(_text(err))
        return n

    def window_logged_bytes(self) -> int:
        """Bytes of the unlogged window that are dirty-logged now because they held still
        (zb_sandbox_window_logged_bytes; docs/ARCHITECTURE.md section 4)."""
        return int(lib.zb_sandbox_window_logged_bytes(self.handle))

    def restore(self, snap: Snapshot) -> None:
        """Make this guest equal to the snapshot again (memory and state), in place."""
        err = _err()
        if lib.zb_sandbox_restore(self.handle, snap.handle, err) < 0:
            raise SandboxError(_text(err))

    def set_memory_limit(self, limit_bytes: int) -> None:
        """Cap the guest's memory at limit_bytes (0: all of its memory). A snapshot carries the
        limit in force when it was taken."""
        lib.zb_sandbox_set_memory_limit(self.handle, max(0, int(limit_bytes)))

    def view_add(self, host_path: str) -> None:
        """Make a host file or tree visible read-only in this guest (also in a fork)."""
        err = _err()
        if lib.zb_sandbox_view_add(self.handle, host_path.encode(), err) < 0:
            raise SandboxError(_text(err))

    PROJECT_MODES = {"readonly": lib.ZB_PROJECT_READONLY, "overlay": lib.ZB_PROJECT_OVERLAY,
                     "readwrite": lib.ZB_PROJECT_READWRITE}

    def mount_project(self, host_dir: str, mode: str = "overlay") -> None:
        """Show host_dir at its own path: readonly, overlay (private writes) or readwrite."""
        err = _err()
        if lib.zb_sandbox_mount_project(self.handle, host_dir.encode(), self._mode(mode), err) < 0:
            raise SandboxError(_text(err))

    def set_project_mode(self, host_dir: str, mode: str) -> None:
        err = _err()
        if lib.zb_sandbox_set_project_mode(self.handle, host_dir.encode(), self._mode(mode), err) < 0:
            raise SandboxError(_text(err))

    def project_hide(self, host_dir: str, paths: list[str]) -> None:
        """Hide paths of the mounted project (relative to it) from the guest, in every mode."""
        for p in paths:
            if not p or p.startswith("/") or "\n" in p or "\0" in p or ".." in p.split("/"):
                raise SandboxError(f"cannot hide {p!r}: give a path relative to the notebook's folder")
        err = _err()
        text = "\n".join(p.strip("/") for p in paths).encode()
        if lib.zb_sandbox_project_hide(self.handle, host_dir.encode(), text, err) < 0:
            raise SandboxError(_text(err))

    def _mode(self, mode: str) -> int:
        if mode not in self.PROJECT_MODES:
            raise SandboxError(f"unknown files mode {mode!r}: use one of {', '.join(self.PROJECT_MODES)}")
        return int(self.PROJECT_MODES[mode])

    def _records(self, fn: Any, guest_path: str, limit: int, what: str) -> tuple[bytes | None, str]:
        """Call a zb_sandbox_* function that fills a buffer with binary records and returns the
        bytes needed; grows the buffer (up to limit). (records, "") or (None, its error)."""
        err = _err()
        size = 65536
        while True:
            buf = ffi.new("char[]", size)
            n = fn(self.handle, guest_path.encode("utf-8", "surrogateescape"), buf, size, err)
            if n < 0:
                return None, _text(err)
            if n <= size:
                return bytes(ffi.buffer(buf, n)), ""
            if n > limit:
                raise SandboxError(f"{guest_path}: {what} larger than {limit >> 20} MiB")
            size = n

    def project_diff(self, host_dir: str) -> list[tuple[str, str]]:
        """What the overlay changed under host_dir: [(tag, relative path), ...] with tags
        listing.CREATED, CHANGED, DELETED, or TOO_DEEP (a directory whose contents are not listed)."""
        data, error = self._records(lib.zb_sandbox_project_diff, host_dir, MAX_LISTING, "the list of changes is")
        if data is None:
            raise SandboxError(error)
        return listing.decode_diff(data)

    def read_chunk(self, guest_path: str, offset: int, size: int) -> bytes:
        """Up to `size` bytes (at most READ_CHUNK) of a regular file at offset, as the guest sees
        it (overlay edits included; a symlink is not followed). b"" at its end."""
        size = max(0, min(size, READ_CHUNK))
        err = _err()
        buf = ffi.new("char[]", max(size, 1))
        n = lib.zb_sandbox_read_file(self.handle, guest_path.encode("utf-8", "surrogateescape"), offset, buf, size, err)
        if n < 0:
            raise SandboxError(_text(err))
        return bytes(ffi.buffer(buf, min(n, size)))

    def stat_entry(self, guest_path: str) -> listing.Entry | None:
        """guest_path itself as a listing entry (its last component not followed), or None if
        it does not exist."""
        data, _ = self._records(lib.zb_sandbox_guest_stat, guest_path, 4096, "a stat record is")
        if data is None:
            return None
        entries = listing.decode_entries(data)
        if len(entries) != 1:
            raise listing.ListingError(f"{guest_path}: malformed stat record from the engine")
        return entries[0]

    def list_dir(self, guest_path: str) -> list[listing.Entry] | None:
        """A directory's entries as the guest sees them (symlinks reported, never followed), or
        None when guest_path is not a directory."""
        data, _ = self._records(lib.zb_sandbox_list_dir, guest_path, MAX_LISTING, "the directory listing is")
        return None if data is None else listing.decode_entries(data)

    def chdir(self, guest_path: str) -> None:
        err = _err()
        if lib.zb_sandbox_chdir(self.handle, guest_path.encode(), err) < 0:
            raise SandboxError(_text(err))

    def set_trace_fd(self, fd: int | None) -> None:
        lib.zb_sandbox_set_trace_fd(self.handle, -1 if fd is None else fd)

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Snapshot:
    """An immutable capture of a guest (zb_snapshot); guests fork from it copy-on-write."""

    def __init__(self, engine: Engine, handle: Any) -> None:
        self.engine = engine
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.zb_snapshot_release, handle)

    @classmethod
    def load(cls, directory: str, engine: Engine | None = None) -> Snapshot:
        engine = engine or Engine.default()
        err = _err()
        handle = lib.zb_snapshot_load(engine.handle, directory.encode(), err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        return cls(engine, handle)

    @property
    def handle(self) -> Any:
        if not self._finalizer.alive:
            raise SandboxError("this snapshot has been released")
        return self._handle

    def save(self, directory: str) -> None:
        err = _err()
        if lib.zb_snapshot_save(self.handle, directory.encode(), err) < 0:
            raise SandboxError(_text(err))

    def lost_children(self) -> list[int]:
        """The pids of the child processes a restore of this checkpoint ends (process 1 sees them
        killed by SIGKILL, or with their own status if they had exited); [] for most snapshots."""
        n = int(lib.zb_snapshot_lost_children(self.handle, ffi.NULL, 0))
        if n <= 0:
            return []
        pids = ffi.new("int32_t[]", n)
        lib.zb_snapshot_lost_children(self.handle, pids, n)
        return [int(p) for p in pids]

    def save_delta(self, state_fd: int, pages_fd: int) -> None:
        """The state and the pages that differ from the memory image, to two fds (session_save.py)."""
        err = _err()
        if lib.zb_snapshot_save_delta(self.handle, state_fd, pages_fd, err) < 0:
            raise SandboxError(_text(err))

    def spill_job(self) -> SpillJob:
        """A job that writes this snapshot to a spill file (zb_spill_prepare): it holds the
        snapshot until freed, whatever happens to this object."""
        err = _err()
        state_len, records, stored = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
        handle = lib.zb_spill_prepare(self.handle, state_len, records, stored, err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        return SpillJob(handle, int(state_len[0]), int(records[0]), int(stored[0]))

    @classmethod
    def load_bytes(cls, state: bytes, mem_fd: int, engine: Engine | None = None) -> Snapshot:
        """A snapshot of saved state bytes (validated by the engine) over a memory image fd."""
        engine = engine or Engine.default()
        err = _err()
        handle = lib.zb_snapshot_load_bytes(engine.handle, state, len(state), mem_fd, err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        return cls(engine, handle)

    def load_aligned(self, state: bytes, words: bytes | memoryview, stored: int, fd: int, direct_fd: int, offset: int,
                     mac: Mac) -> Snapshot:
        """A snapshot over this snapshot's memory image of a spilled checkpoint's record in the
        aligned layout (zb_snapshot_load_aligned), validated by the engine, so that a sandbox of
        this lineage can be restored to it: its state, the page records' words, and the page
        contents (stored pages of them) read from the file at offset (through direct_fd where it takes
        the read, else fd) straight into the snapshot and added to mac, whose tag the
        caller checks before it uses the snapshot (and releases it if the tag is wrong)."""
        err = _err()
        handle = lib.zb_snapshot_load_aligned(self.handle, state, len(state), ffi.from_buffer(words), len(words) // 8,
                                              stored, fd, direct_fd, offset, mac.handle, err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        return Snapshot(self.engine, handle)

    def fork(self) -> Guest:
        err = _err()
        handle = lib.zb_snapshot_fork(self.handle, err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        return Guest(self.engine, handle)

    @property
    def private_bytes(self) -> int:
        """Host memory this snapshot holds on its own (the pages it copied)."""
        return int(lib.zb_snapshot_private_bytes(self.handle))

    def release(self) -> None:
        self._finalizer()

    @property
    def released(self) -> bool:
        return not self._finalizer.alive


class SpillJob:
    """A snapshot being written to a spill file (checkpoint_spill.py). prepare (Snapshot.spill_job)
    and free run on the engine's thread; write, on the spill writer's thread, while the engine goes
    on (the call releases the GIL). free only after write returned (or was never called).
    records: the page records of the delta; stored: those with contents (the others are zero pages)."""

    def __init__(self, handle: Any, state_len: int, records: int, stored: int) -> None:
        self.handle = handle
        self.state_len = state_len
        self.records = records
        self.stored = stored

    @property
    def pages_len(self) -> int:
        """The page records' bytes as zb_snapshot_save_delta writes them (the record's "pages raw")."""
        return 8 * self.records + PAGE_SIZE * self.stored

    def write(self, fd: int, direct_fd: int, offset: int, head: bytes, key: bytes, nonce: bytes,
              mac_len: int) -> bytes:
        """Write the record at offset in the aligned layout (zb_spill_write: head, state, page
        index, page contents through direct_fd, MAC); the MAC. SandboxError saying what failed."""
        if self.handle is None:
            raise SandboxError("this spill job was freed")
        err = _err()
        mac = ffi.new("uint8_t[]", mac_len)
        if lib.zb_spill_write(self.handle, fd, direct_fd, offset, head, len(head), key, len(key), nonce, len(nonce),
                              mac, mac_len, err) < 0:
            raise SandboxError(_text(err))
        return bytes(ffi.buffer(mac, mac_len))

    def free(self) -> None:
        if self.handle is not None:
            lib.zb_spill_job_free(self.handle)
            self.handle = None


class Mac:
    """The spill file's MAC (zb_mac_*: GMAC with a key and a nonce it must never see twice), fed
    in parts like hashlib's objects; digest() ends it."""

    KEY_BYTES = lib.ZB_MAC_KEY_BYTES
    NONCE_BYTES = lib.ZB_MAC_NONCE_BYTES
    TAG_BYTES = lib.ZB_MAC_TAG_BYTES

    def __init__(self, key: bytes, nonce: bytes) -> None:
        err = _err()
        handle = lib.zb_mac_begin(key, len(key), nonce, len(nonce), err)
        if handle == ffi.NULL:
            raise SandboxError(_text(err))
        self._raw = handle
        self._handle: Any = ffi.gc(handle, lib.zb_mac_abandon)

    @property
    def handle(self) -> Any:
        """The zb_mac, for a native call that adds bytes to it (SandboxError once ended)."""
        if self._handle is None:
            raise SandboxError("this MAC has ended")
        return self._raw

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._handle is None:
            raise SandboxError("this MAC has ended")
        if lib.zb_mac_update(self._handle, ffi.from_buffer(data), len(data)) < 0:
            raise SandboxError("the MAC could not take more bytes (OpenSSL refused them)")

    def digest(self, length: int = TAG_BYTES) -> bytes:
        if self._handle is None:
            raise SandboxError("this MAC has ended")
        ffi.gc(self._handle, None)  # zb_mac_end frees it
        self._handle = None
        err, tag = _err(), ffi.new("uint8_t[]", length)
        if lib.zb_mac_end(self._raw, tag, length, err) < 0:
            raise SandboxError(_text(err))
        return bytes(ffi.buffer(tag, length))


def mac_prepare() -> None:
    """Load the MAC's cipher now, before the engine's lockdown (zb_mac_prepare)."""
    err = _err()
    if lib.zb_mac_prepare(err) < 0:
        raise SandboxError(_text(err))


def snapshots_memory(snapshots: list[Snapshot]) -> int:
    """Bytes of host memory the page stores of these snapshots hold, each shared store once."""
    handles = [s.handle for s in snapshots if not s.released]
    if not handles:
        return 0
    return int(lib.zb_snapshots_memory(ffi.new("zb_snapshot *[]", handles), len(handles)))


def unlogged_window(on: bool) -> bool:
    """Whether guest memory made from now on gets an unlogged window, a KVM memslot without dirty
    logging where big anonymous mappings go (zb_mem_unlogged_window; on by default). Off is for
    measurements. Returns the previous setting."""
    return bool(lib.zb_mem_unlogged_window(1 if on else 0))


def keep_spare_pages(on: bool) -> None:
    """While on, snapshot store pages that die are kept for the next snapshot to write into
    (zb_snapshot_keep_spare); off gives back what is left."""
    lib.zb_snapshot_keep_spare(1 if on else 0)


def watch_fd(fd: int, on: bool) -> None:
    """While on, input arriving on fd kicks the calling thread's sandbox run (zb_engine_watch_fd:
    O_ASYNC with the engine's queued watch signal)."""
    if lib.zb_engine_watch_fd(fd, 1 if on else 0) < 0:
        err = ffi.errno
        raise OSError(err, f"cannot watch file descriptor {fd} for input: {os.strerror(err)}")


def give_back_dead_store_pages() -> None:
    """Give back the checkpoint store pages that died and wait to be punched out in a batch
    (zb_snapshot_give_back_dead): an idle session holds none."""
    lib.zb_snapshot_give_back_dead()


def dead_waiting_bytes() -> int:
    """Bytes of dead checkpoint store pages waiting to be given back in a batch."""
    return int(lib.zb_snapshot_dead_waiting_bytes())


def spare_bytes() -> int:
    """Bytes of store pages kept for the next snapshot (0 outside _checkpoint_now)."""
    return int(lib.zb_snapshot_spare_bytes())


def spare_reused_bytes() -> int:
    """Bytes of snapshot pages this process has written into spare pages instead of fresh ones."""
    return int(lib.zb_snapshot_spare_reused_bytes())


def monotonic_deadline(timeout: float | None) -> float | None:
    return time.monotonic() + timeout if timeout else None
