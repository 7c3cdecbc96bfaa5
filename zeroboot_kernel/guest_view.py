"""What the guest sees: the files of this environment's Python, and how it is started.

The guest gets a read-only view of exactly what the interpreter needs (its prefixes, the
environment's site-packages, the guest agent, and the host shared libraries that the interpreter
and the extension modules load), a private in-memory /tmp and home directory, and a fixed identity
(user "sandbox", uid 1000, host name "zeroboot").
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import site
import sys
import sysconfig
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import zeroboot_guest

from . import elf_deps

log = logging.getLogger(__name__)

GUEST_HOME = "/home/sandbox"
GUEST_DIR = Path(zeroboot_guest.__file__).resolve().parent

IDENTITY_FILES = {
    "/etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n",
    "/etc/group": b"root:x:0:\nsandbox:x:1000:\n",
    "/etc/hostname": b"zeroboot\n",
    "/etc/hosts": b"127.0.0.1 localhost\n127.0.1.1 zeroboot\n",
    "/etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files\n",
}

# One CPU and no threads in the guest: keep numeric libraries from trying to start any.
THREAD_ENV = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")}


@dataclass
class GuestSpec:
    """Everything needed to boot a guest program in a fresh sandbox."""

    exe: str
    argv: list[str]
    env: dict[str, str]
    view: list[str]
    cwd: str = GUEST_HOME
    mem_bytes: int = 1 << 30
    memory_limit: int = 0
    overlay_dirs: list[str] = field(default_factory=lambda: ["/tmp", GUEST_HOME])
    files: dict[str, bytes] = field(default_factory=lambda: dict(IDENTITY_FILES))


def python_prefixes() -> list[str]:
    """The interpreter's installation prefixes (a venv and its base installation)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(os.path.realpath(p) for p in prefixes if p)


def site_dirs() -> list[str]:
    """Site-packages directories of this environment that exist."""
    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        dirs.add(site.getusersitepackages())
    purelib = sysconfig.get_paths().get("purelib")
    if purelib:
        dirs.add(purelib)
    return sorted(d for d in dirs if os.path.isdir(d))


def stdlib_dirs() -> list[str]:
    """The standard library and its extension modules (lib-dynload) of the base installation:
    in a venv, sysconfig's stdlib paths point into the venv, so look at sys.path instead."""
    dirs = {p for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)}
    dirs.add(os.path.dirname(os.__file__))
    return sorted(dirs)


def _view_cache_file() -> Path:
    """Where python_view() is cached: keyed by the interpreter and the modification times of the
    directories whose contents decide the view (installing or upgrading a package changes its
    site-packages directory, so the cache is recomputed)."""
    stamp = [os.path.realpath(sys.executable), sys.version]
    for d in python_prefixes() + site_dirs() + stdlib_dirs():
        try:
            stamp.append(f"{d}:{os.stat(d).st_mtime_ns}")
        except OSError:
            stamp.append(d)
    digest = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:20]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zeroboot-kernel" / f"view-{digest}.json"


@lru_cache(maxsize=1)
def python_view() -> tuple[str, ...]:
    """Host paths the guest needs to run this environment's Python (cached on disk)."""
    cache = _view_cache_file()
    try:
        cached = json.loads(cache.read_text())
        if isinstance(cached, list) and all(isinstance(p, str) for p in cached):
            return tuple(cached)
    except (OSError, ValueError):
        pass
    view = _compute_python_view()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(list(view)))
        os.replace(tmp, cache)
    except OSError as exc:
        log.debug("cannot cache the guest view: %s", exc)
    return view


def _compute_python_view() -> tuple[str, ...]:
    prefixes = python_prefixes()
    sites = site_dirs()
    # the interpreter by its real path: `python` and `python3` in a venv must give the same view
    # (and so the same template key); the venv's own bin/ is inside its prefix anyway
    view = set(prefixes) | set(sites) | {os.path.realpath(sys.executable), str(GUEST_DIR)}
    roots = [os.path.realpath(sys.executable)] + elf_deps.extension_modules(sites + stdlib_dirs())
    libs, _missing = elf_deps.library_closure(roots)
    view |= {lib for lib in libs if not elf_deps.under_any(lib, prefixes + sites)}
    # ld.so finds libraries through its cache; local time comes from /etc/localtime, other time
    # zones (zoneinfo, datetime's tests, pandas) from the system's tz database
    view |= {p for p in ("/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo") if os.path.exists(p)}
    log.debug("guest view: %d paths", len(view))
    return tuple(sorted(view))


# Compiled locales (glibc's locale-archive and per-locale folders): `setlocale(LC_ALL, "")` with the
# host's LANG/LC_* (forwarded, guest_environ.py) finds the same locales as on the host.
LOCALE_DIRS = ("/usr/lib/locale", "/usr/lib64/locale")


def locale_view(env: dict[str, str] | None = None) -> list[str]:
    """The host's compiled locales, read-only: the standard folders and those LOCPATH names."""
    env = dict(os.environ) if env is None else env
    dirs = list(LOCALE_DIRS) + [p for p in env.get("LOCPATH", "").split(":") if os.path.isabs(p)]
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


def guest_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "PATH": os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin:/bin",
        "HOME": GUEST_HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        **THREAD_ENV,
    }
    if os.environ.get("TZ"):
        env["TZ"] = os.environ["TZ"]
    env.update(extra or {})
    return env


def python_spec(args: list[str], *, env: dict[str, str] | None = None, extra_view: list[str] | None = None,
                mem_bytes: int = 1 << 30, cwd: str = GUEST_HOME) -> GuestSpec:
    """A spec that runs this environment's own interpreter with `args` (as in `python ARGS`)."""
    return GuestSpec(
        exe=sys.executable,
        argv=[sys.executable, *args],
        env=guest_env(env),
        view=list(python_view()) + locale_view() + list(extra_view or []),
        mem_bytes=mem_bytes,
        cwd=cwd,
    )
