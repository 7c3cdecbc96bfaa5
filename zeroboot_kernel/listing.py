"""The engine's binary listings of guest directories and of the notebook folder's overlay
(native/zeroboot.h: zb_sandbox_list_dir, zb_sandbox_guest_stat, zb_sandbox_project_diff).

Guest names may hold any byte but '/' and NUL (newlines and tabs included), so the engine sends
records with explicit lengths, and this module decodes them strictly: a record that does not fit,
an unknown kind or a name that is not a single path component is an error, never guessed at.
Names are decoded with surrogateescape, so every byte survives the trip to the host.
"""
from __future__ import annotations

import struct
import unicodedata
from dataclasses import dataclass

from .errors import SandboxError

# entry kinds (ZB_ENTRY_*)
DIR, FILE, SYMLINK, OTHER = "d", "f", "l", "o"
KINDS = {100: DIR, 102: FILE, 108: SYMLINK, 111: OTHER}
# diff tags (ZB_DIFF_*)
CREATED, CHANGED, DELETED, TOO_DEEP = "A", "M", "D", "!"
TAGS = {65: CREATED, 77: CHANGED, 68: DELETED, 33: TOO_DEEP}

_ENTRY = struct.Struct("<BQH")
_DIFF = struct.Struct("<BI")
NAME_MAX = 255
PATH_MAX_BYTES = 1 << 20  # a diff path: depth (ZB_DIFF_MAX_DEPTH) times NAME_MAX, and more


class ListingError(SandboxError):
    """The engine's listing is malformed (a bug, or memory the guest should not reach)."""


@dataclass(frozen=True)
class Entry:
    kind: str    # DIR, FILE, SYMLINK or OTHER
    name: str    # one path component (surrogateescape-decoded bytes)
    size: int    # regular files: the size in bytes; else 0


def check_name(name: str) -> str:
    """A guest name that is safe to use as one component of a host path: not empty, not '.' or
    '..', no '/' or NUL, at most NAME_MAX bytes. Returns it; raises ListingError otherwise."""
    raw = name.encode("utf-8", "surrogateescape")
    if not raw or raw in (b".", b"..") or b"/" in raw or b"\0" in raw or len(raw) > NAME_MAX:
        raise ListingError(f"unusable file name from the sandbox: {name!r}")
    return name


def decode_entries(data: bytes) -> list[Entry]:
    entries: list[Entry] = []
    pos = 0
    while pos < len(data):
        if pos + _ENTRY.size > len(data):
            raise ListingError("truncated directory listing from the engine")
        kind, size, n = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        if kind not in KINDS or pos + n > len(data):
            raise ListingError("malformed directory listing from the engine")
        name = check_name(data[pos:pos + n].decode("utf-8", "surrogateescape"))
        pos += n
        entries.append(Entry(KINDS[kind], name, size if KINDS[kind] == FILE else 0))
    return entries


def decode_diff(data: bytes) -> list[tuple[str, str]]:
    """[(tag, relative path)]; every component of each path is checked like a name."""
    changes: list[tuple[str, str]] = []
    pos = 0
    while pos < len(data):
        if pos + _DIFF.size > len(data):
            raise ListingError("truncated diff from the engine")
        tag, n = _DIFF.unpack_from(data, pos)
        pos += _DIFF.size
        if tag not in TAGS or n > PATH_MAX_BYTES or pos + n > len(data):
            raise ListingError("malformed diff from the engine")
        rel = data[pos:pos + n].decode("utf-8", "surrogateescape")
        pos += n
        for part in rel.split("/"):
            check_name(part)
        changes.append((TAGS[tag], rel))
    return changes


def printable(text: str) -> str:
    """A guest name for a human: control and format characters (newlines, escapes, bidi
    overrides) and undecodable bytes escaped, so a name cannot forge lines or terminal escapes in
    what the kernel prints."""
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:          # an undecodable byte (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)
