"""What the guest sees: the files of this environment's Python, and how it is started.

The guest gets a read-only view of exactly what the interpreter needs (the venv's directory, the
standard library, the site-packages directories, the guest agent, and the loader and host shared
libraries that the interpreter and the extension modules load), the system view (SYSTEM_VIEW_*:
/usr less /usr/local, /bin, /lib*: programs to execve), a private in-memory /tmp and home
directory, and a fixed identity (user "sandbox", uid 1000, host name "zeroboot").

Paths go into the view as the interpreter and its loader spell them; the guest's namespace mirrors
each symlink on the way, so every chain (a venv's bin/python -> /usr/bin/python3 -> python3.11,
merged /usr's /lib64 -> usr/lib64 -> /lib/x86_64-linux-gnu/...) resolves in the guest as on the
host. This works the same for Debian's /usr/bin/python3, pyenv or other source builds, venvs and
`pip install --user` layouts.
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
from .errors import ZerobootError

log = logging.getLogger(__name__)

GUEST_HOME = "/home/sandbox"
VIEW_FORMAT = 2  # bump when _compute_python_view changes what it returns
GUEST_DIR = Path(zeroboot_guest.__file__).resolve().parent

IDENTITY_FILES = {
    "/etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n",
    "/etc/group": b"root:x:0:\nsandbox:x:1000:\n",
    "/etc/hostname": b"zeroboot\n",
    "/etc/hosts": b"127.0.0.1 localhost\n127.0.1.1 zeroboot\n",
    "/etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files dns\n",
    # the sandbox's resolver, answered by the engine (native/net_dns.c) when the session has a
    # network policy; one query at a time (no sendmmsg), answers come at once
    "/etc/resolv.conf": b"nameserver 192.0.2.53\noptions single-request attempts:1 timeout:2\n",
    # what shells read (measured with strace on Debian: dash, bash, coreutils' ls/env, grep, sed,
    # awk and sort open /etc/ld.so.cache (in the view), passwd, group, nsswitch.conf, localtime;
    # a login shell /etc/profile; /etc/shells names the valid login shells)
    "/etc/profile": b"# the zeroboot sandbox: PATH and the rest of the environment come from the kernel\n",
    "/etc/shells": b"/bin/sh\n/usr/bin/sh\n/bin/bash\n/usr/bin/bash\n/bin/dash\n/usr/bin/dash\n",
}

# The read-only system view (issue 15, docs/SECURITY.md "The system view"): host directories the
# guest sees whole, at their own paths, so that there is something to execute: /bin/sh, bash,
# coreutils, grep, sed, awk and the libraries they load. ZEROBOOT_SYSTEM_VIEW replaces the list
# (':'-separated absolute host directories, "none" for no system view); it is part of the
# template (the namespace is captured with it), so a change rebuilds the template.
SYSTEM_VIEW_VARIABLE = "ZEROBOOT_SYSTEM_VIEW"
SYSTEM_VIEW_DEFAULT = ("/usr", "/bin", "/sbin", "/lib", "/lib64")  # /bin, /sbin, /lib* are symlinks into /usr on merged-/usr systems
# Left out of the default directories: /usr/local is the site's own software and configuration
# (/usr/local/etc, admin scripts in /usr/local/bin, CUDA and vendor trees), not the distribution's,
# and may hold credentials; what the Python view needs from it (an interpreter installed there)
# is still shown, file by file. Naming a directory below it in ZEROBOOT_SYSTEM_VIEW shows it.
SYSTEM_VIEW_HIDDEN = ("/usr/local",)
# Never shown whole, whatever the variable says: host data (homes, service data, spools, logs,
# runtime state), the host's own configuration (/etc: the guest has its own synthetic files),
# the kernel's interfaces (the guest has its own /proc and /dev) and the root itself.
# Host /etc entries the system's programs need, shown with any system view: Debian's alternatives
# (/usr/bin/awk -> /etc/alternatives/awk -> /usr/bin/mawk; also which, pager, editor, ...), which
# are only symlinks to programs and resolve in the guest's namespace (an alternative pointing into
# /usr/local leads nowhere, as /usr/local itself).
SYSTEM_VIEW_ETC = ("/etc/alternatives",)
SYSTEM_VIEW_REFUSED = ("/", "/etc", "/home", "/root", "/var", "/srv", "/run", "/tmp", "/mnt", "/media",
                       "/opt", "/proc", "/sys", "/dev", "/boot", "/snap", "/lost+found")


class SystemViewError(ZerobootError):
    """ZEROBOOT_SYSTEM_VIEW names something the guest may not see whole."""

# One CPU in the guest (its threads share the one vCPU): thread pools of numeric libraries would only
# add switches, so they stay at one thread.
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
    overlay_dirs: list[str] = field(default_factory=lambda: ["/tmp", GUEST_HOME, "/dev/shm"])
    files: dict[str, bytes] = field(default_factory=lambda: dict(IDENTITY_FILES))


def python_prefixes() -> list[str]:
    """The interpreter's installation prefixes (a venv and its base installation)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(os.path.realpath(p) for p in prefixes if p)


def environment_trees() -> list[str]:
    """Prefixes the guest sees whole: this environment's own directory when it is a virtual
    environment (its pyvenv.cfg, scripts and data files). A base installation's prefix is not
    given whole, because it may be /usr or /usr/local, which hold far more than Python: its
    standard library and site-packages are given instead (stdlib_dirs, site_dirs)."""
    return sorted({os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix)
                   if p and os.path.isfile(os.path.join(p, "pyvenv.cfg"))})


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


def user_base() -> str | None:
    """The host's user base (~/.local) when this Python uses a user site-packages (a `pip
    install --user` layout): the guest's HOME differs, so it is told where the user base is."""
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site and os.path.isdir(user_site) and site.getuserbase():
        return site.getuserbase()
    return None


def _view_cache_file() -> Path:
    """Where python_view() is cached: keyed by the interpreter and the modification times of the
    directories whose contents decide the view (installing or upgrading a package changes its
    site-packages directory, so the cache is recomputed)."""
    stamp = [os.path.abspath(sys.executable), os.path.realpath(sys.executable), sys.version, str(VIEW_FORMAT)]
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
        if isinstance(cached, list) and all(isinstance(p, str) for p in cached) and \
                all(os.path.lexists(p) for p in cached):
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


def _too_broad(path: str) -> bool:
    """A symlink target that would show the guest a whole top-level directory or the home
    directory (a stray `ln -s / x` in site-packages) is left out rather than followed."""
    real = os.path.realpath(path)
    return os.path.dirname(real) == "/" or real == "/" or real == os.path.realpath(os.path.expanduser("~"))


def _compute_python_view() -> tuple[str, ...]:
    """Every path is added as the interpreter or its loader spells it (the guest's namespace
    mirrors each symlink on the way), never only by its resolved path: a venv's bin/python is a
    symlink to the base interpreter, /lib64 and /lib are symlinks into /usr on merged-/usr
    systems, and Debian's stdlib links sitecustomize.py into /etc."""
    trees = environment_trees()
    sites = site_dirs()
    stdlib = stdlib_dirs()
    objects, links = elf_deps.scan_trees(sorted(set(trees + sites + stdlib)))
    view = set(trees) | set(sites) | set(stdlib) | {sys.executable, os.path.realpath(sys.executable), str(GUEST_DIR)}
    for link in links:
        # symlinks inside the view that lead out of it (sitecustomize.py -> /etc/python3.11/...):
        # their targets are added through the link; dangling ones stay dangling
        if not os.path.exists(link):
            continue
        if _too_broad(link):
            log.warning("guest view: leaving out %s: it points at %s", link, os.path.realpath(link))
            continue
        view.add(link)
    libs, _missing = elf_deps.library_closure(objects, programs=[sys.executable])
    view |= libs
    # ld.so finds libraries through its cache; local time comes from /etc/localtime, other time
    # zones (zoneinfo, datetime's tests, pandas) from the system's tz database
    view |= {p for p in ("/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo") if os.path.exists(p)}
    log.debug("guest view: %d paths", len(view))
    return tuple(sorted(view))


def system_view_dirs(env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The system view's directories: ZEROBOOT_SYSTEM_VIEW's, else SYSTEM_VIEW_DEFAULT."""
    env = dict(os.environ) if env is None else env
    raw = (env.get(SYSTEM_VIEW_VARIABLE) or "").strip()
    if not raw:
        return SYSTEM_VIEW_DEFAULT
    if raw.lower() == "none":
        return ()
    dirs = []
    for part in raw.split(":"):
        part = part.strip()
        if not part:
            continue
        norm = os.path.normpath(part)
        if not os.path.isabs(part) or norm in SYSTEM_VIEW_REFUSED or norm.startswith(("/home/", "/root/", "/var/", "/run/",
                                                                                     "/proc/", "/sys/", "/dev/", "/etc/")):
            raise SystemViewError(f"{SYSTEM_VIEW_VARIABLE}={raw!r}: {part!r} cannot be shown to the sandbox: use absolute "
                                  f"directories of installed software such as /usr or /opt/tool (never /, /etc, homes, "
                                  f"/var, /run or /tmp: docs/SECURITY.md, \"The system view\")")
        dirs.append(norm)
    return tuple(dirs)


def _expand(path: str, hidden: tuple[str, ...]) -> list[str]:
    """path itself, or, when a hidden path lies below it, its entries less the hidden ones (and so
    on down to the hidden path), so that the hidden directory is absent from the guest's tree."""
    below = [h for h in hidden if h.startswith(path.rstrip("/") + "/")]
    if not below or os.path.islink(path):
        return [path]
    if path in hidden:
        return []
    out: list[str] = []
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    for name in names:
        child = os.path.join(path, name)
        if child not in hidden:
            out.extend(_expand(child, hidden))
    return out


def system_view(env: dict[str, str] | None = None) -> list[str]:
    """Host paths of the system view (system_view_dirs, less SYSTEM_VIEW_HIDDEN), those that exist.
    A directory named in the variable below a hidden one is shown: the variable says so."""
    dirs = system_view_dirs(env)
    paths: set[str] = set()
    for d in dirs:
        if not os.path.lexists(d):
            continue
        hidden = tuple(h for h in SYSTEM_VIEW_HIDDEN if not (d == h or d.startswith(h + "/")))
        paths.update(_expand(d, hidden))
    if dirs:
        paths.update(p for p in SYSTEM_VIEW_ETC if os.path.isdir(p))
    return sorted(paths)


def program_in_system_view(path: str, env: dict[str, str] | None = None) -> bool:
    """Whether the guest can run the host program at `path` (an absolute path): it is an executable
    file inside the system view, so the guest sees it at the same path."""
    if not os.path.isabs(path):
        return False
    real = os.path.realpath(path)
    if not (os.path.isfile(real) and os.access(real, os.X_OK)):
        return False
    return any(real == p or real.startswith(p.rstrip("/") + "/") for p in system_view(env))


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
    base = user_base()
    if base:
        env["PYTHONUSERBASE"] = base
    env.update(extra or {})
    return env


def python_spec(args: list[str], *, env: dict[str, str] | None = None, extra_view: list[str] | None = None,
                mem_bytes: int = 1 << 30, cwd: str = GUEST_HOME) -> GuestSpec:
    """A spec that runs this environment's own interpreter with `args` (as in `python ARGS`)."""
    return GuestSpec(
        exe=sys.executable,
        argv=[sys.executable, *args],
        env=guest_env(env),
        view=list(python_view()) + system_view() + locale_view() + list(extra_view or []),
        mem_bytes=mem_bytes,
        cwd=cwd,
    )
