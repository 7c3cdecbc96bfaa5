"""IPython's autoreload with one VM exit per check instead of one per module (issue 24).

`%autoreload 2` runs ModuleReloader.check() before every cell: an os.stat() of the source of each
module in sys.modules (~1,100 with numpy, pandas and matplotlib), to compare its mtime with the
last one seen; `%load_ext autoreload` does it once to record them. On the host that is ~2 ms; in
the sandbox each stat is a VM exit (~50 us here), so every cell took ~100 ms more. Here check()
first asks the host for all of those stats in one exit (zeroboot's ZB_SYS_STAT_MANY,
guest/guest_abi.h) and its os.stat() calls are answered from them, each answer once; a path that
was not asked for ahead, or any other call, goes to os as before. The answers are the host's at
the start of the check, as they are when the loop runs on the host in a few milliseconds, so a
module edited before the cell is reloaded as under ipykernel.

Where the syscall is missing (the agent run as a host process by the tests, or an engine without
it) the stat fails with ENOSYS and check() runs unchanged.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import struct
import sys
from importlib.util import source_from_cache
from pathlib import Path
from typing import Any, Callable

from .agent_after_import import when_imported

_ABI = Path(__file__).resolve().parents[1] / "guest_abi.h"  # the one copy of the numbers


def _abi_number(name: str) -> int | None:
    """A `#define NAME <int>` of guest_abi.h, or None where the header is not beside the agent."""
    try:
        text = _ABI.read_text()
    except OSError:
        return None
    found = re.search(rf"^#define {name} (0x[0-9a-fA-F]+|\d+)\b", text, re.MULTILINE)
    return int(found.group(1), 0) if found else None


SYS_STAT_MANY = _abi_number("ZB_SYS_STAT_MANY")
STAT_MANY_MAX = _abi_number("ZB_STAT_MANY_MAX") or 0
# struct stat on x86-64 (144 bytes): dev, ino, nlink, mode, uid, gid, pad, rdev, size, blksize,
# blocks, atime, atime_nsec, mtime, mtime_nsec, ctime, ctime_nsec, 3 reserved
_STAT = struct.Struct("<QQQIIIiQqqqqqqqqq24x")


def _stat_result(raw: bytes) -> os.stat_result:
    """os.stat_result as os.stat() builds it from the same struct stat."""
    (dev, ino, nlink, mode, uid, gid, _pad, rdev, size, blksize, blocks,
     a_s, a_ns, m_s, m_ns, c_s, c_ns) = _STAT.unpack(raw)
    return os.stat_result((mode, ino, dev, nlink, uid, gid, size, a_s, m_s, c_s,
                           a_s + a_ns * 1e-9, m_s + m_ns * 1e-9, c_s + c_ns * 1e-9,
                           a_s * 1_000_000_000 + a_ns, m_s * 1_000_000_000 + m_ns, c_s * 1_000_000_000 + c_ns,
                           blksize, blocks, rdev))


@functools.cache  # once per process, not per check
def _syscall() -> Any:
    """libc's syscall(), returning a long."""
    function = ctypes.CDLL(None, use_errno=True).syscall
    function.restype = ctypes.c_long
    return function


def stat_many(paths: list[str]) -> dict[str, os.stat_result | int]:
    """stat() of each path in one exit per ZB_STAT_MANY_MAX paths: the result, or the errno the
    stat would have raised. {} where the sandbox cannot answer (then stat each path yourself)."""
    if SYS_STAT_MANY is None or STAT_MANY_MAX <= 0:
        return {}
    syscall = _syscall()
    answers: dict[str, os.stat_result | int] = {}
    usable = [p for p in dict.fromkeys(paths) if "\0" not in p]  # os.stat raises ValueError for those
    for start in range(0, len(usable), STAT_MANY_MAX):
        chunk = usable[start:start + STAT_MANY_MAX]
        n = len(chunk)
        names = (ctypes.c_char_p * n)(*(os.fsencode(p) for p in chunk))
        out = ctypes.create_string_buffer(_STAT.size * n)
        errors = (ctypes.c_int32 * n)()
        done = syscall(ctypes.c_long(SYS_STAT_MANY), names, ctypes.c_long(n), out, errors, ctypes.c_long(0))
        if done != n:
            return {}
        raw = out.raw
        for i, path in enumerate(chunk):
            answers[path] = errors[i] or _stat_result(raw[i * _STAT.size:(i + 1) * _STAT.size])
    return answers


class _OsWithAnswers:
    """The `os` autoreload's code sees during one check(): stat(path) answers a path fetched ahead
    (once), everything else is os's own."""

    def __init__(self, answers: dict[str, os.stat_result | int]) -> None:
        self._answers = answers

    def stat(self, path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        answer = self._answers.pop(path, None) if isinstance(path, str) and not args and not kwargs else None
        if answer is None:
            return os.stat(path, *args, **kwargs)
        if isinstance(answer, int):
            raise OSError(answer, os.strerror(answer), path)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def _source_path(module: Any) -> str | None:
    """The file autoreload's filename_and_mtime() stats for a module (None: it stats nothing)."""
    filename = getattr(module, "__file__", None)
    if not isinstance(filename, str) or getattr(module, "__name__", None) in (None, "__mp_main__", "__main__"):
        return None
    return _source_of(filename)


@functools.lru_cache(maxsize=8192)  # a pure function of the name; a .so's ValueError is slow
def _source_of(filename: str) -> str | None:
    if os.path.splitext(filename)[1].lower() == ".py":
        return filename
    try:
        return source_from_cache(filename)
    except ValueError:
        return None


def _with_stat_ahead(autoreload: Any, check: Callable[..., Any]) -> Callable[..., Any]:
    def check_with_stat_ahead(self: Any, check_all: bool = False, *args: Any, **kwargs: Any) -> Any:
        if not self.enabled and not check_all:
            return check(self, check_all, *args, **kwargs)
        try:
            names = list(sys.modules) if check_all or self.check_all else list(self.modules)
            skip = getattr(self, "skip_modules", ())
            answers = stat_many([p for p in (_source_path(sys.modules.get(n)) for n in names if n not in skip) if p])
        except Exception:  # noqa: BLE001 - a problem here costs speed only: check() as it is
            answers = {}
        if not answers:
            return check(self, check_all, *args, **kwargs)
        autoreload.os = _OsWithAnswers(answers)
        try:
            return check(self, check_all, *args, **kwargs)
        finally:
            autoreload.os = os

    check_with_stat_ahead.__wrapped__ = check  # type: ignore[attr-defined]
    return check_with_stat_ahead


def _adapt(autoreload: Any) -> None:
    reloader = getattr(autoreload, "ModuleReloader", None)
    check = getattr(reloader, "check", None)
    if reloader is None or check is None or getattr(autoreload, "os", None) is not os:
        return  # another IPython than this was written for: leave it as it is
    reloader.check = _with_stat_ahead(autoreload, check)


def install() -> None:
    if SYS_STAT_MANY is not None:
        when_imported({"IPython.extensions.autoreload": _adapt})
