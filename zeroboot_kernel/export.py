"""%sandbox export: copy what the sandbox sees at a path (its private edits included) into the
notebook's folder on the host.

Reading happens where the sandbox lives (the engine process, through zb_sandbox_read_file and
zb_sandbox_list_dir); writing happens on the host side, in the kernel process, confined to the
notebook's folder. So the engine process never needs to write host files (its seccomp filter
forbids that), and a guest can only ever get files exported where the user asked.
"""
from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any

from .errors import SandboxError
from .native import Guest

MAX_EXPORT_BYTES = 2 << 30
MAX_DEPTH = 64


@dataclass(frozen=True)
class ExportItem:
    rel: str          # path relative to the exported path ("" for the path itself)
    is_dir: bool
    data: bytes = b""


def collect(guest: Guest, path: str) -> list[ExportItem]:
    """Everything at `path` in the guest's view: one file, or a directory tree (symlinks skipped)."""
    items: list[ExportItem] = []
    total = 0

    def walk(guest_path: str, rel: str, depth: int) -> None:
        nonlocal total
        if depth > MAX_DEPTH:
            raise SandboxError(f"{path}: directories nested too deeply to export")
        entries = guest.list_dir(guest_path)
        if entries is None:
            data = guest.read_file(guest_path)
            total += len(data)
            if total > MAX_EXPORT_BYTES:
                raise SandboxError(f"{path}: more than {MAX_EXPORT_BYTES >> 30} GiB to export")
            items.append(ExportItem(rel, False, data))
            return
        items.append(ExportItem(rel, True))
        for kind, name in entries:
            if kind != "l":
                walk(f"{guest_path}/{name}", f"{rel}/{name}" if rel else name, depth + 1)

    walk(path, "", 0)
    return items


def to_wire(items: list[ExportItem]) -> list[dict[str, Any]]:
    return [{"rel": i.rel, "dir": i.is_dir, "data": base64.b64encode(i.data).decode()} for i in items]


def from_wire(rows: list[dict[str, Any]]) -> list[ExportItem]:
    return [ExportItem(str(r["rel"]), bool(r["dir"]), base64.b64decode(r.get("data") or "")) for r in rows]


def write(items: list[ExportItem], dest: str, root: str) -> list[str]:
    """Write items at dest, which must lie inside root (the notebook's folder). Never follows a
    symlink on the way; returns the host paths written."""
    root = os.path.realpath(root)
    dest = os.path.abspath(os.path.join(root, dest))
    parent = os.path.realpath(os.path.dirname(dest))
    if os.path.commonpath([root, parent]) != root or dest == root:
        raise SandboxError(f"{dest}: export only writes inside the notebook's folder {root}")
    written = []
    for item in items:
        target = os.path.join(dest, item.rel) if item.rel else dest
        if os.path.islink(target):
            raise SandboxError(f"{target} is a symlink on the host: not overwritten")
        if item.is_dir:
            os.makedirs(target, exist_ok=True)
            continue
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(item.data)
        written.append(target)
    return written
