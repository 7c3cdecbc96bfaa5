"""Checkpoints spilled to disk: older %rewind checkpoints kept in a per-session file, not in memory.

When the checkpoints' memory budget (checkpoint_budget.py) would drop the oldest checkpoint, the
session writes it here instead (Session._spill_out) and releases its memory once the write is done;
`%rewind N` to it reads it back as a snapshot over the template's memory image
(zb_snapshot_load_aligned), so the live sandbox is restored to it like to any checkpoint of its lineage.

The write does not hold up the next request: the engine reserves the record's place (reserve),
serializes the checkpoint's state and takes a reference to its snapshot (zb_spill_prepare), and the
spill writer thread (SpillWriter, one per process, started before the engine's seccomp lockdown,
which then filters it too) writes the record straight from the snapshot's stores (zb_spill_write,
no copy into memfds, the MAC computed while writing, the page contents with O_DIRECT). The session takes the result on its own
thread (PendingSpill.done, Session._reap_spills) and only then releases the snapshot; until then
the checkpoint is "writing": a %rewind to it uses the in-memory copy, a release of it lets the
write finish first and then frees the record's space. Nothing depends on when the write ends.

The writer can be slower than cells that replace their data (~400 MB in 0.3-0.4 s here, against
~0.2-0.3 s for such a cell and its checkpoint; through the page cache and with a portable BLAKE2b
MAC it took 1.5 s), and what is in flight is held in memory, so it is bounded (Session._writing_cap). A
checkpoint that must leave memory while that bound is reached is dropped (a gap in %rewind's list:
%rewind to it is refused, saying why) if the writer has not caught up within WAIT_BOUND_S, so a
Run All waits for the disk at most that long per cell (ZEROBOOT_CHECKPOINT_SPILL_BEHIND=wait: as long
as it takes; =drop: never, as before the writer kept up with such cells).

The file:
- is created by the engine process itself, before its run-phase lockdown (which forbids creating
  host files), in `<cache>/zeroboot-kernel/spill/`, with O_TMPFILE: it has no name, so it is gone
  when the engine process ends, also when it is killed (nothing is left to clean up). Where O_TMPFILE
  is not supported it is created under a name and unlinked at once; a successor session removes any
  such name whose process is gone (sweep_leftovers). Never a path from the guest.
- holds one record per spilled checkpoint: only the pages that differ from the template's memory
  image (zero pages as an index entry only) and the engine's state. Each record starts on an ALIGN
  block and takes whole blocks (span), in the layout below, whose page contents are written with
  O_DIRECT (a second descriptor of the same file, _open_direct; the page cache throttled a growing
  file's dirty pages to the disk's write-back speed, and each cost a fresh page of host memory).
  Records are not compressed (session saves are, session_save.py). Space of records that went
  (rewound past, dropped) is reused by later records and the file's tail is truncated (the
  run-phase lockdown allows no hole punching); the file never exceeds the disk budget.
- is read back as untrusted input: the record's position and length are the session's own (kept in
  memory), every length is bounded before anything is read, a MAC (GMAC: AES-256-GCM
  over the bytes as associated data, native.Mac, OpenSSL) with a key that exists only in this process
  and the record's id as its nonce (never given twice) proves the bytes are the ones written, and the engine
  validates the state and page records (snapshot_file.c). A corrupt record is a SpillError for that
  %rewind.

Record layout (little-endian; zb_spill_write writes it):
    MAGIC (8) | u64 record id | u8 codec (3) | u64 state raw | u64 state stored | u64 pages raw
    | u64 pages stored | state | pages | GMAC tag (16) of the state and pages, then the header
pages: u64 count | count u64 words (`pfn << 1 | zero`, zb_snapshot_save_delta's) | zeros up to an
ALIGN boundary of the file | the contents of the pages whose word says stored, in order ("pages
raw" is the length of the same records interleaved, as zb_snapshot_save_delta writes them). load()
reads the contents straight into the snapshot's store (zb_snapshot_load_aligned) and checks the
MAC before the snapshot is used.
"""
from __future__ import annotations

import hmac
import logging
import math
import os
import queue
import re
import secrets
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping


from .checkpoint_budget import BudgetSyntaxError, parse_size
from .errors import SandboxError, ZerobootError

if TYPE_CHECKING:  # the kernel process reads this module's settings without the engine (native library)
    from .native import Mac, Snapshot, SpillJob

log = logging.getLogger(__name__)

ENV = "ZEROBOOT_CHECKPOINT_DISK"
BEHIND_ENV = "ZEROBOOT_CHECKPOINT_SPILL_BEHIND"  # bounded (default), drop or wait: see wait_from_env
BEHIND_CHOICES = ("", "bounded", "drop", "wait")
WAIT_BOUND_S = 2.0             # "bounded": the longest a checkpoint waits for the writes in flight
MAGIC = b"ZBSPILL\x01"
HEAD = struct.Struct("<8sQBQQQQ")
MAC_BYTES = 16                 # ZB_MAC_TAG_BYTES: GMAC's tag
KEY_BYTES = 32                 # ZB_MAC_KEY_BYTES: a MAC key, one per spill file
PAGE = 4096
ALIGN = 4096                   # ZB_SPILL_ALIGN: records (and the aligned layout's page contents) start on it
CODEC_ALIGNED = 3              # the record layout below (0 and 2 were records of a writer from memfds)
MAX_STATE = 2 << 30            # as STATE_MAX_BYTES in native/snapshot_file.c
DEFAULT_MAX = 16 << 30         # the default disk budget: at most this ...
DEFAULT_SHARE = 4              # ... and at most 1/DEFAULT_SHARE of the file system's free space
LEFTOVER_RE = re.compile(r"spill-(\d+)-[0-9a-f]{16}\.tmp")


class SpillError(ZerobootError):
    """A checkpoint could not be written to or read back from the spill file."""


def from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The disk budget set in the environment (0: no spilling), or None for the default."""
    value = (env if env is not None else os.environ).get(ENV, "").strip()
    if not value or value.lower() == "auto":
        return None
    try:
        return parse_size(value)
    except BudgetSyntaxError as exc:
        raise BudgetSyntaxError(f"{ENV}={value!r}: {exc}") from None


def wait_from_env(env: Mapping[str, str] | None = None) -> float:
    """How long a checkpoint that must leave memory while the writer is still busy waits for it
    (BEHIND_ENV), in seconds; if the writes in flight have not ended by then, it is dropped (a gap
    for %rewind). "bounded" (the default): WAIT_BOUND_S, which a disk of ~200 MB/s meets for a
    checkpoint of 400 MB, so that %rewind keeps every checkpoint where the disk keeps up and a
    slow disk costs a Run All at most that much per cell; "wait": as long as it takes (Run All goes
    at the disk's speed); "drop": not at all (the next cell never waits for the disk). Raises
    BudgetSyntaxError for another value."""
    value = (env if env is not None else os.environ).get(BEHIND_ENV, "").strip().lower()
    if value not in BEHIND_CHOICES:
        raise BudgetSyntaxError(f"{BEHIND_ENV}={value!r}: give one of {', '.join(c for c in BEHIND_CHOICES if c)}")
    return {"drop": 0.0, "wait": math.inf}.get(value, WAIT_BOUND_S)


def default_disk_budget(directory: Path) -> int:
    """min(DEFAULT_MAX, the free space of the directory's file system / DEFAULT_SHARE)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return min(DEFAULT_MAX, st.f_bavail * st.f_frsize // DEFAULT_SHARE)


def spill_dir(templates: Path) -> Path:
    """<cache>/zeroboot-kernel/spill, next to the templates folder (template.cache_root())."""
    return templates.parent / "spill"


def _alive(pid: int) -> bool:
    return pid > 0 and os.path.exists(f"/proc/{pid}")


def sweep_leftovers(directory: Path) -> list[str]:
    """Remove named spill files (the O_TMPFILE fallback) whose engine process is gone; their names."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = LEFTOVER_RE.fullmatch(name)
        if not m or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(directory / name)
            removed.append(name)
        except OSError as exc:
            log.warning("cannot remove the leftover spill file %s: %s", directory / name, exc.strerror)
    return removed


@dataclass
class SpillRef:
    """Where a spilled checkpoint is in the file (the session's own record of it, never read back)."""
    record: int
    offset: int
    length: int
    raw_bytes: int          # state + pages before compression
    codec: int
    write_s: float
    pending: bool = False   # reserved, being written by the spill writer (not readable yet)


def _open_file(directory: Path) -> int:
    flags = os.O_RDWR | os.O_CLOEXEC
    try:
        return os.open(directory, flags | os.O_TMPFILE, 0o600)
    except OSError:  # a file system without O_TMPFILE: a name, unlinked at once
        path = directory / f"spill-{os.getpid()}-{secrets.token_hex(8)}.tmp"
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.unlink(path)
        except OSError as exc:  # removed by a successor's sweep_leftovers once this process is gone
            log.warning("cannot unlink the spill file %s: %s", path, exc.strerror)
        return fd


def _open_direct(fd: int) -> int:
    """The spill file opened again with O_DIRECT, for the page contents the spill writer writes
    (past the page cache: see zb_spill_write); -1 where the file system has no O_DIRECT (tmpfs),
    and the writer then writes them through fd."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC | os.O_DIRECT)
    except OSError as exc:
        log.info("the spill file cannot be written with O_DIRECT (%s): through the page cache", exc.strerror)
        return -1


class SpillFile:
    """One session's spill file (see the module doc); limit: the disk budget in bytes."""

    def __init__(self, directory: Path, limit: int) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = directory
        self.removed_leftovers = sweep_leftovers(directory)
        self.fd = _open_file(directory)
        self.direct_fd = _open_direct(self.fd)
        self.limit = limit
        self._key = secrets.token_bytes(KEY_BYTES)
        self._next = 1
        self._free: list[tuple[int, int]] = []   # (offset, length) gaps inside the file, sorted
        self.end = 0                              # the file's size
        self.used = 0                             # bytes in live records
        self.live: dict[int, SpillRef] = {}

    @property
    def key(self) -> bytes:
        """The MAC key (this process only), for the spill writer."""
        return self._key

    # ---- writing ----
    def _place(self, length: int) -> int:
        """The offset of a new record's span (ALIGN-aligned: every span is a multiple of ALIGN)."""
        length = span(length)
        for i, (off, size) in enumerate(self._free):
            if size >= length:
                if size == length:
                    del self._free[i]
                else:
                    self._free[i] = (off + length, size - length)
                return off
        off, self.end = self.end, self.end + length
        return off

    def fits(self, length: int) -> bool:
        """A record of this length (aligned_length) fits the disk budget now."""
        return self.used + span(length) <= self.limit

    def _mac(self, record: int) -> Mac:
        from .native import Mac  # the engine's process only (the kernel's reads settings here)
        return Mac(self._key, nonce(record))

    def reserve(self, state_len: int, records: int, stored: int) -> SpillRef:
        """The place of an aligned record (the spill writer's, PendingSpill) of a delta with these
        lengths: counted as used from now, readable once finished. SpillError if it does not fit."""
        length = aligned_length(state_len, records, stored)
        if not self.fits(length):
            raise SpillError(f"a checkpoint of {length >> 20} MiB does not fit the spill file's disk budget "
                             f"({self.used >> 20} of {self.limit >> 20} MiB used)")
        raw = state_len + pages_raw(records, stored)
        ref = SpillRef(self._next, self._place(length), length, raw, CODEC_ALIGNED, 0.0, pending=True)
        self._next += 1
        self.used += span(length)
        self.live[ref.record] = ref
        return ref

    def head(self, ref: SpillRef, state_len: int, records: int, stored: int) -> bytes:
        """The header of a reserved aligned record."""
        return HEAD.pack(MAGIC, ref.record, CODEC_ALIGNED, state_len, state_len, pages_raw(records, stored),
                         ref.length - HEAD.size - state_len - MAC_BYTES)

    # ---- freeing ----
    def _give_back(self, off: int, length: int) -> None:
        """A record's span (or what a failed write reserved) is free again."""
        if length <= 0:
            return
        length = span(length)
        gaps = sorted(self._free + [(off, length)])
        merged: list[tuple[int, int]] = []
        for o, n in gaps:
            if merged and merged[-1][0] + merged[-1][1] >= o:
                po, pn = merged[-1]
                merged[-1] = (po, max(po + pn, o + n) - po)
            else:
                merged.append((o, n))
        if merged and merged[-1][0] + merged[-1][1] >= self.end:  # the tail: the file gets shorter
            self.end = merged.pop()[0]
            try:
                os.ftruncate(self.fd, self.end)
            except OSError as exc:
                log.warning("cannot shorten the spill file: %s", exc.strerror)
        self._free = merged

    def free(self, ref: SpillRef) -> None:
        if self.live.pop(ref.record, None) is None:
            return
        self.used -= span(ref.length)
        self._give_back(ref.offset, ref.length)

    # ---- reading back (untrusted) ----
    def load(self, ref: SpillRef, base: Snapshot, memory_size: int) -> Snapshot:
        """A spilled checkpoint as a snapshot over base's memory image, checked; SpillError saying
        what is wrong. The record's page contents are read straight into the snapshot's store
        (through the O_DIRECT descriptor where there is one), the MAC taken as they come in."""
        self._check_readable(ref, memory_size)
        head = self._pread(HEAD.size, ref.offset)
        magic, record, codec, state_raw, state_stored, raw_pages, pages_stored = HEAD.unpack(head)
        max_records = memory_size // PAGE
        if magic != MAGIC or record != ref.record or codec != CODEC_ALIGNED or state_raw != state_stored \
                or state_raw > MAX_STATE or HEAD.size + state_stored + pages_stored + MAC_BYTES != ref.length:
            raise SpillError("the spilled checkpoint's record header is corrupt")
        records = int.from_bytes(self._pread(8, ref.offset + HEAD.size + state_stored), "little")
        if records > max_records:
            raise SpillError("the spilled checkpoint's page index is corrupt")
        data = contents_offset(state_stored, records)
        stored, left = divmod(ref.length - MAC_BYTES - data, PAGE)
        if left or not 0 <= stored <= records or raw_pages != pages_raw(records, stored):
            raise SpillError("the spilled checkpoint's page index and contents disagree")
        prefix = memoryview(self._pread(data - HEAD.size, ref.offset + HEAD.size))
        mac = self._mac(ref.record)
        mac.update(prefix)  # state, count, words, zeros
        words = prefix[state_stored + 8:state_stored + 8 + 8 * records]
        try:
            snap = base.load_aligned(bytes(prefix[:state_stored]), words, stored, self.fd, self.direct_fd,
                                     ref.offset + data, mac)
        except SandboxError as exc:
            raise SpillError(str(exc)) from None
        tag = self._pread(MAC_BYTES, ref.offset + data + PAGE * stored)
        mac.update(head)
        if not hmac.compare_digest(mac.digest(), tag):
            snap.release()
            raise SpillError("the spilled checkpoint was changed on disk since it was written (its checksum does "
                             "not match)")
        return snap

    def _check_readable(self, ref: SpillRef, memory_size: int) -> None:
        if self.live.get(ref.record) is not ref:
            raise SpillError("this checkpoint is no longer in the spill file")
        if ref.pending:
            raise SpillError("this checkpoint is still being written to the spill file")
        max_pages = (memory_size // PAGE) * (8 + PAGE)
        if ref.length < HEAD.size + MAC_BYTES or ref.length > span(HEAD.size + MAX_STATE + 8) + max_pages + MAC_BYTES:
            raise SpillError("the spilled checkpoint's record has an impossible length")

    def _pread(self, length: int, offset: int) -> bytes:
        """Exactly length bytes at offset (the caller bounded length); SpillError if the file is shorter."""
        try:
            data = os.pread(self.fd, length, offset)
            while len(data) < length:
                more = os.pread(self.fd, length - len(data), offset + len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise SpillError(f"cannot read the spilled checkpoint: {exc.strerror}") from None
        if len(data) != length:
            raise SpillError("the spill file is shorter than the checkpoint written to it (truncated)")
        return data

    def close(self) -> None:
        if self.direct_fd >= 0:
            os.close(self.direct_fd)
            self.direct_fd = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.live.clear()
        self.used = 0

    def describe(self) -> dict[str, int]:
        return {"disk_budget_bytes": self.limit, "disk_used_bytes": self.used, "disk_file_bytes": self.end,
                "spilled": len(self.live)}


def span(length: int) -> int:
    """The file space a record of this length takes: whole ALIGN blocks, so that every record starts
    on a block (the page contents of the aligned layout are written with O_DIRECT)."""
    return -(-length // ALIGN) * ALIGN


def contents_offset(state_len: int, records: int) -> int:
    """Where an aligned record's page contents start, from the record's start: after the head, the
    state, the u64 count and the records' u64 words, at the next ALIGN boundary."""
    return span(HEAD.size + state_len + 8 * (1 + records))


def pages_raw(records: int, stored: int) -> int:
    """The page records' length interleaved, as zb_snapshot_save_delta writes them (a header's
    "pages raw"): a u64 word per record, 4096 bytes per stored page."""
    return 8 * records + PAGE * stored


def aligned_length(state_len: int, records: int, stored: int) -> int:
    """The length of an aligned record (zb_spill_write): up to the page contents, the stored pages'
    contents, MAC."""
    return contents_offset(state_len, records) + PAGE * stored + MAC_BYTES


def nonce(record: int) -> bytes:
    """The MAC's nonce for a record: its id, which the file never gives twice (ZB_MAC_NONCE_BYTES)."""
    return record.to_bytes(12, "little")


@dataclass
class PendingSpill:
    """A checkpoint's record being written by the spill writer. The session's thread makes it
    (Session._spill_out) and, once `done` is set, reads `error` and frees the job (Session._reap_spills)."""
    job: SpillJob
    ref: SpillRef
    fd: int
    direct_fd: int
    head: bytes
    key: bytes
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""
    seconds: float = 0.0

    def run(self) -> None:
        """The write itself (the writer's thread, or the caller's where no writer thread exists)."""
        t0 = time.perf_counter()
        try:
            self.job.write(self.fd, self.direct_fd, self.ref.offset, self.head, self.key, nonce(self.ref.record),
                           MAC_BYTES)
        except Exception as exc:  # noqa: BLE001 - reported to the session's thread, never lost here
            self.error = str(exc) or type(exc).__name__
        finally:
            self.seconds = time.perf_counter() - t0
            self.done.set()


class SpillWriter:
    """The process's spill writer: one thread that runs PendingSpills in order. Started before the
    engine's seccomp lockdown (engine_server.main; the filters forbid new threads, and apply to this
    one too); where no thread can be started, a spill is written on the caller's thread.
    hold()/release() stop it before its next write, so tests can fix what is in flight."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[PendingSpill] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._gate = threading.Event()
        self._gate.set()
        self._lock = threading.Lock()
        self.start_error = ""

    def start(self) -> bool:
        with self._lock:
            if self._thread is None and not self.start_error:
                t = threading.Thread(target=self._run, name="zeroboot-spill-writer", daemon=True)
                try:
                    t.start()
                except RuntimeError as exc:  # after the lockdown: no new threads
                    self.start_error = str(exc)
                    log.warning("no spill writer thread (%s): spills are written before the next request", exc)
                else:
                    self._thread = t
            return self._thread is not None

    def submit(self, p: PendingSpill) -> None:
        if self.start():
            self._queue.put(p)
        else:
            p.run()

    def hold(self) -> None:
        """Tests: the writer waits before its next write until release()."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def _run(self) -> None:
        while True:
            p = self._queue.get()
            self._gate.wait()
            p.run()


WRITER = SpillWriter()
