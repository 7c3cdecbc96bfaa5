"""%sandbox export: copy what the sandbox sees at a path (its private edits included) into the
notebook's folder on the host.

Two halves in two processes:
  reading, in the engine process (where the sandbox lives): `plan` lists the tree at the path
    (iteratively, bounded in depth, entries and bytes, sizes known before any byte is read), and
    `read_chunk` reads one bounded piece of one file. Guest symlinks are never followed: they
    are listed as symlinks and not exported, and so are FIFOs, sockets and devices;
  writing, in the kernel process (the engine may not write host files): `write` checks the plan
    again (it came from a process that parsed guest data), then creates each directory and file
    under a directory fd of the export destination, walking one validated name at a time with
    O_NOFOLLOW | O_DIRECTORY. A file is written to a fresh temporary name (O_EXCL) and renamed
    into place, so a host symlink or hard link at the target, or one swapped in while the export
    runs, is never written through. The destination is inside the notebook's folder, which the
    kernel knows itself (never from a reply).
Every name is one path component: no '/', NUL, '.' or '..' (listing.check_name).
"""
from __future__ import annotations

import base64
import binascii
import errno
import functools
import logging
import os
import secrets
import stat
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

from . import listing
from .errors import SandboxError

if TYPE_CHECKING:  # the kernel process uses this module without the engine's native library
    from .native import Guest

log = logging.getLogger(__name__)

MAX_EXPORT_BYTES = 2 << 30
MAX_ENTRIES = 100_000
MAX_DEPTH = 64
MAX_PLAN_NAME_BYTES = 16 << 20    # the names of all entries' paths together: bounds the listing's message
REPORT_LINES = 50                 # files listed by name in what %sandbox export prints
CHUNK = 1 << 20                   # one read from the engine (one message on the engine channel)
KINDS = (listing.DIR, listing.FILE, listing.SYMLINK, listing.OTHER)

Reader = Callable[[tuple[str, ...], int, int], bytes]   # (parts, offset, size) -> at most size bytes


class ExportError(SandboxError):
    """An export that cannot be done as asked; the message says why."""


@dataclass(frozen=True)
class PlanEntry:
    parts: tuple[str, ...]   # path below the exported path; () is the path itself
    kind: str                # listing.DIR, FILE, SYMLINK or OTHER
    size: int = 0            # FILE: bytes (from the listing, before reading)


# ---- the reading half (engine process) ----------------------------------------------------

def plan(guest: Guest, path: str) -> list[PlanEntry]:
    """The tree at `path` as the guest sees it, parents before children. Raises ExportError when
    it is missing, too deep, too many entries or too many bytes, before anything is read."""
    top = guest.stat_entry(path)
    if top is None:
        raise ExportError(f"{path} does not exist in the sandbox")
    if top.kind in (listing.SYMLINK, listing.OTHER):
        raise ExportError(f"{path} is a {'symlink' if top.kind == listing.SYMLINK else 'special file'} in the "
                          f"sandbox: export copies regular files and directories, and never follows symlinks")
    entries = [PlanEntry((), top.kind, top.size)]
    total = top.size
    name_bytes = 0
    todo: list[tuple[str, ...]] = [()] if top.kind == listing.DIR else []
    while todo:
        parts = todo.pop()
        if len(parts) >= MAX_DEPTH:
            raise ExportError(f"{path}: directories nested more than {MAX_DEPTH} deep; export a subfolder")
        found = guest.list_dir(guest_path(path, parts))
        if found is None:
            raise ExportError(f"{guest_path(path, parts)}: no longer a directory in the sandbox")
        for e in sorted(found, key=lambda e: e.name):
            child = parts + (e.name,)
            entries.append(PlanEntry(child, e.kind, e.size))
            total += e.size
            name_bytes += sum(len(p) for p in child)
            if name_bytes > MAX_PLAN_NAME_BYTES:
                raise ExportError(f"{path}: the names of the files to export are too long together "
                                  f"(more than {MAX_PLAN_NAME_BYTES >> 20} MiB); export a subfolder")
            if len(entries) > MAX_ENTRIES:
                raise ExportError(f"{path}: more than {MAX_ENTRIES} entries to export; export a subfolder")
            if total > MAX_EXPORT_BYTES:
                raise ExportError(f"{path}: more than {MAX_EXPORT_BYTES >> 30} GiB to export")
            if e.kind == listing.DIR:
                todo.append(child)
    # depth-first order with parents first: sort by parts (a parent sorts before its children)
    return sorted(entries, key=lambda e: e.parts)


def guest_path(path: str, parts: tuple[str, ...]) -> str:
    for p in parts:
        listing.check_name(p)
    return "/".join((path.rstrip("/") or "/", *parts)) if parts else path


def read_chunk(guest: Guest, path: str, parts: tuple[str, ...], offset: int, size: int) -> bytes:
    if offset < 0 or size < 0:
        raise ExportError("negative offset or size")
    return guest.read_chunk(guest_path(path, parts), offset, min(size, CHUNK))


def plan_to_wire(entries: list[PlanEntry]) -> list[dict[str, Any]]:
    return [{"parts": list(e.parts), "kind": e.kind, "size": e.size} for e in entries]


# ---- checking what came over the wire (kernel process) -------------------------------------

def plan_from_wire(rows: Any) -> list[PlanEntry]:
    """A plan from the engine's reply, checked as untrusted input: types, sizes, names, order
    (each entry's parent listed before it as a directory), totals."""
    if not isinstance(rows, list) or not rows or len(rows) > MAX_ENTRIES:
        raise ExportError("malformed export listing from the engine")
    entries: list[PlanEntry] = []
    dirs: set[tuple[str, ...]] = set()
    seen: set[tuple[str, ...]] = set()
    total = 0
    for row in rows:
        if not isinstance(row, dict):
            raise ExportError("malformed export listing from the engine")
        parts, kind, size = row.get("parts"), row.get("kind"), row.get("size")
        if (not isinstance(parts, list) or len(parts) > MAX_DEPTH or not all(isinstance(p, str) for p in parts)
                or kind not in KINDS or type(size) is not int or not 0 <= size <= MAX_EXPORT_BYTES):
            raise ExportError("malformed export listing from the engine")
        key = tuple(listing.check_name(p) for p in parts)
        if key in seen or (key and key[:-1] not in dirs) or (not key and entries) or (key and not entries):
            raise ExportError("malformed export listing from the engine (order or duplicates)")
        if not key and kind not in (listing.DIR, listing.FILE):
            raise ExportError("malformed export listing from the engine")
        seen.add(key)
        if kind == listing.DIR:
            dirs.add(key)
        total += size if kind == listing.FILE else 0
        if total > MAX_EXPORT_BYTES:
            raise ExportError(f"more than {MAX_EXPORT_BYTES >> 30} GiB to export")
        entries.append(PlanEntry(key, kind, size if kind == listing.FILE else 0))
    return entries


def chunk_from_wire(reply: Any, asked: int) -> bytes:
    data = reply.get("data") if isinstance(reply, dict) else None
    if not isinstance(data, str) or len(data) > 4 * ((CHUNK + 2) // 3) + 4:
        raise ExportError("malformed file data from the engine")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ExportError("malformed file data from the engine") from None
    if len(raw) > asked:
        raise ExportError("the engine sent more file data than asked for")
    return raw


# ---- the writing half (kernel process) -----------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(parent_fd: int, name: str) -> int:
    """Open the directory `name` (one checked component) under parent_fd, never through a
    symlink (O_NOFOLLOW: ELOOP; a file: ENOTDIR)."""
    try:
        return os.open(listing.check_name(name), _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ExportError(f"{name}: not a directory (or a symlink) on the host; export does not write through "
                              f"it") from None
        raise


def _walk(base_fd: int, parts: tuple[str, ...]) -> int:
    """A new fd of base/parts[0]/parts[1]/..., each step a real directory."""
    fd = os.dup(base_fd)
    try:
        for name in parts:
            nxt = _open_dir(fd, name)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _dest_parts(root: str, dest: str) -> tuple[str, ...]:
    """DEST (relative to the notebook's folder, or absolute inside it) as checked components."""
    rel = dest
    if os.path.isabs(dest):
        norm = os.path.normpath(dest)
        if os.path.commonpath([root, norm]) != root:
            raise ExportError(f"{dest}: export only writes inside the notebook's folder {root}")
        rel = os.path.relpath(norm, root)
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    if not parts:
        raise ExportError(f"{dest}: give a file or folder name inside the notebook's folder {root}, not the folder")
    if ".." in parts:
        raise ExportError(f"{dest}: '..' is not allowed in an export destination")
    for p in parts:
        listing.check_name(p)
    return parts


def _make_dir(parent_fd: int, name: str) -> None:
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise ExportError(f"{name} exists on the host and is not a directory "
                              f"({'a symlink' if stat.S_ISLNK(st.st_mode) else 'a file'}): not replaced") from None


def _write_file(parent_fd: int, name: str, size: int, read: Callable[[int, int], bytes]) -> int:
    """Write `size` bytes (read(offset, n) in chunks) to parent_fd/name; returns bytes written."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "special"
        raise ExportError(f"{name} is {kind} on the host: not overwritten")
    tmp = f".zb-export-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent_fd)
    done = False
    written = 0
    try:
        with os.fdopen(fd, "wb") as f:
            while written < size:
                data = read(written, min(CHUNK, size - written))
                if not data:
                    break  # the file is shorter than listed: what there is
                f.write(data)
                written += len(data)
        # rename replaces the name itself: a symlink swapped in meanwhile is replaced, not followed
        os.rename(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        done = True
    finally:
        if not done:
            try:
                os.unlink(tmp, dir_fd=parent_fd)
            except OSError:
                pass
    return written


@dataclass
class ExportReport:
    written: list[str]        # host paths of the files written
    skipped: list[str]        # host-relative paths not exported (symlinks, special files)
    bytes: int = 0


def _has_control_chars(name: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name)


def write(entries: list[PlanEntry], read: Reader, dest: str, root: str, root_fd: int | None = None) -> ExportReport:
    """Write a checked plan at `dest` inside `root` (the notebook's folder), reading file data
    through read(parts, offset, size). The parents of dest must exist in the folder. Symlinks,
    special files and names with control characters (newlines, escapes, bidi overrides: legal on
    Linux, but traps for the user's shell and tools) are not created, and reported. `root_fd`, a
    directory fd of root opened earlier (the kernel opens the folder once, at start), is used
    instead of opening root by its path."""
    root = os.path.realpath(root) if root_fd is None else root  # else: as it was when root_fd was opened
    dparts = _dest_parts(root, dest)
    report = ExportReport([], [])
    root_fd = os.dup(root_fd) if root_fd is not None else os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        base_fd = _walk(root_fd, dparts[:-1])
    finally:
        os.close(root_fd)
    not_created: list[tuple[str, ...]] = []
    try:
        for e in entries:
            if any(e.parts[:len(p)] == p for p in not_created):
                continue  # inside a directory that was not created (reported once, there)
            host_rel = "/".join(dparts + e.parts)
            *parent, name = dparts[-1:] + e.parts
            why = ("symlink" if e.kind == listing.SYMLINK else "special file" if e.kind == listing.OTHER
                   else "control characters in the name" if _has_control_chars(name) else None)
            if why:
                report.skipped.append(f"{host_rel} ({why})")
                not_created.append(e.parts)
                continue
            parent_fd = _walk(base_fd, tuple(parent))
            try:
                if e.kind == listing.DIR:
                    _make_dir(parent_fd, name)
                else:
                    report.bytes += _write_file(parent_fd, name, e.size,
                                                functools.partial(read, e.parts))
                    report.written.append(os.path.join(root, host_rel))
            finally:
                os.close(parent_fd)
    finally:
        os.close(base_fd)
    return report


def _lines(paths: list[str]) -> str:
    text = "".join(f"  {listing.printable(p)}\n" for p in paths[:REPORT_LINES])
    if len(paths) > REPORT_LINES:
        text += f"  ... and {len(paths) - REPORT_LINES} more\n"
    return text


def format_report(path: str, report: ExportReport) -> str:
    text = f"exported {listing.printable(path)}: {len(report.written)} file(s) written to the host\n"
    text += _lines(report.written)
    if report.skipped:
        text += "not exported (export copies regular files and directories and never follows a symlink):\n"
        text += _lines(report.skipped)
    return text
