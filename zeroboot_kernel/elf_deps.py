"""Which shared libraries a set of ELF files loads: DT_NEEDED, resolved the way ld.so does.

Used to give the guest exactly the host libraries its interpreter and extension modules need
(libc, libm, libz, ...), derived at run time instead of hard-coded for one machine.

Paths are kept as the loader spells them (`/lib64/ld-linux-x86-64.so.2`, the path
/etc/ld.so.cache names, `$ORIGIN/../lib/libfoo.so`), never canonicalised: the guest's loader
opens those very strings, so the view must contain each one together with the symlinks it goes
through (on a merged-/usr system `/lib` and `/lib64` are symlinks into /usr). The guest's
namespace mirrors every symlink of a path it is given, so handing it the unresolved path is
what reproduces the chain.
"""
from __future__ import annotations

import logging
import os
import struct
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 1, 5, 15, 29
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


class ElfInfo:
    """The dynamic-linking facts of one ELF file."""

    def __init__(self, needed: list[str], rpath: list[str], runpath: list[str], interp: str | None) -> None:
        self.needed = needed
        self.rpath = rpath
        self.runpath = runpath
        self.interp = interp


def read_elf(path: str) -> ElfInfo | None:
    """Parse DT_NEEDED/RPATH/RUNPATH and PT_INTERP; None if path is not a 64-bit ELF."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    loads, dynamic, interp = [], None, None
    for i in range(phnum):
        off = phoff + i * phentsize
        if off + 56 > len(data):
            return None
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from("<IIQQQQQQ", data, off)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
        elif p_type == PT_INTERP:
            interp = data[p_offset:p_offset + p_filesz].rstrip(b"\0").decode(errors="replace")
    if dynamic is None:
        return ElfInfo([], [], [], interp)

    def vaddr_to_offset(vaddr: int) -> int | None:
        for start, off, size in loads:
            if start <= vaddr < start + size:
                return off + (vaddr - start)
        return None

    entries = []
    off, size = dynamic
    for pos in range(off, min(off + size, len(data) - 15), 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == 0:
            break
        entries.append((tag, val))
    strtab = next((vaddr_to_offset(v) for t, v in entries if t == DT_STRTAB), None)
    if strtab is None:
        return ElfInfo([], [], [], interp)

    def string(at: int) -> str:
        end = data.find(b"\0", strtab + at)
        return data[strtab + at:end].decode(errors="replace")

    needed = [string(v) for t, v in entries if t == DT_NEEDED]
    rpath = [p for t, v in entries if t == DT_RPATH for p in string(v).split(":") if p]
    runpath = [p for t, v in entries if t == DT_RUNPATH for p in string(v).split(":") if p]
    return ElfInfo(needed, rpath, runpath, interp)


@lru_cache(maxsize=1)
def ld_cache() -> dict[str, str]:
    """soname -> path for x86-64 libraries in /etc/ld.so.cache (from `ldconfig -p`)."""
    out: dict[str, str] = {}
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            text = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=True).stdout
            break
        except (OSError, subprocess.CalledProcessError):
            continue
    else:
        log.warning("ldconfig not found: resolving libraries from the default directories only")
        return out
    for line in text.splitlines():
        left, sep, path = line.partition("=>")
        if not sep or "x86-64" not in left:
            continue
        out.setdefault(left.split()[0], path.strip())
    return out


def _expand(dirs: Iterable[str], origin: str) -> list[str]:
    return [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in dirs]


def resolve(name: str, loader: str, info: ElfInfo, origin: str | None = None) -> str | None:
    """Find library `name` needed by `loader` (whose ELF facts are `info`), as ld.so would.

    `origin` is what $ORIGIN stands for: glibc takes the directory of the path the object was
    opened by (symlinks not resolved), except for the main program, whose path comes from
    /proc/self/exe (resolved); the default is the loader's own directory."""
    if "/" in name:
        return name if os.path.exists(name) else None
    if origin is None:
        origin = os.path.dirname(os.path.abspath(loader))
    dirs = [] if info.runpath else _expand(info.rpath, origin)
    dirs += _expand(info.runpath, origin)
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    cached = ld_cache().get(name)
    if cached and os.path.exists(cached):
        return cached
    for d in DEFAULT_DIRS:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    return None


def library_closure(roots: Iterable[str], programs: Iterable[str] = ()) -> tuple[set[str], set[str]]:
    """All libraries (and ELF interpreters) the roots and programs load, transitively, each by
    the path the loader uses (not resolved); and the names that could not be found (logged, left
    out). `programs` are main executables: their $ORIGIN is their resolved directory."""
    found: set[str] = set()
    missing: set[str] = set()
    todo = [(os.path.realpath(p), True) for p in programs] + [(p, False) for p in roots]
    seen: set[tuple[str, str]] = set()
    while todo:
        path, is_program = todo.pop()
        origin = os.path.dirname(os.path.realpath(path) if is_program else os.path.abspath(path))
        # one file reached by two paths can have two $ORIGINs: visit it once per origin
        key = (os.path.realpath(path), origin)
        if key in seen:
            continue
        seen.add(key)
        info = read_elf(path)
        if info is None:
            continue
        if info.interp:
            found.add(info.interp)
        for name in info.needed:
            lib = resolve(name, path, info, origin)
            if lib is None:
                missing.add(name)
                continue
            found.add(lib)
            todo.append((lib, False))
    for name in sorted(missing):
        log.debug("library %s is needed but not found on this host", name)
    return found, missing


def extension_modules(dirs: Iterable[str]) -> list[str]:
    """Every shared object (*.so, *.so.N) under the given directories."""
    return scan_trees(dirs)[0]


def scan_trees(dirs: Iterable[str]) -> tuple[list[str], list[str]]:
    """Every shared object (*.so, *.so.N) under the given directories, and every symlink there
    (to files or to directories, which are not descended into)."""
    objects: list[str] = []
    links: list[str] = []
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            for name in files:
                path = os.path.join(root, name)
                if os.path.islink(path):
                    links.append(path)
                if name.endswith(".so") or ".so." in name:
                    objects.append(path)
            links.extend(os.path.join(root, s) for s in subdirs if os.path.islink(os.path.join(root, s)))
    return objects, links


def under_any(path: str, prefixes: Iterable[str]) -> bool:
    p = Path(os.path.realpath(path))
    return any(p == Path(x) or Path(x) in p.parents for x in prefixes)
