"""Templates: a snapshot of the guest agent after it imported numpy & co, stored on disk.

A template lives in $XDG_CACHE_HOME/zeroboot-kernel/templates/<name>-<key>/ as memory.img (all of
guest memory, sparse), state.bin (everything else) and manifest.json. The key hashes everything
the snapshot depends on: this package and its native build, the interpreter, the installed
distributions, the preload list, guest memory size and the host's KVM CPU model. A template whose
key no longer matches is stale and is never used; building writes a new one.

Builders coordinate: building template <name> holds an exclusive flock on .<name>.lock in the
cache, so when several kernels start on an empty cache one builds and the others wait (saying so
every few seconds) and then load its result. A template is written into a hidden .build-<name>.*
directory on the same file system and published by one rename, so nobody ever sees half of one.
Publishing and discarding (the renames) hold an exclusive flock on the cache directory itself and
loading holds a shared one, so a loader never reads the state.bin of one build and the memory.img
of another, nor mistakes a template being replaced for a corrupt one. The locks die with their
holder (the kernel drops them), and the next builder of a name removes what a killed one left
behind. The cache belongs to one user: it is created private (0700) and a cache owned by someone
else is refused.

Test hook: ZEROBOOT_TEST_BUILD_PAUSE=<stage> (one of BUILD_STAGES) makes a builder stop at that
stage, holding the build lock, until it receives SIGUSR1 (or dies): tests kill builders at exact
points instead of guessing with sleeps.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from . import __version__, frames
from .errors import SandboxError, TemplateError
from .guest_environ import template_environment
from .guest_memory_size import default_memory
from .guest_view import GUEST_DIR, locale_view, python_spec, python_view, system_view
from .native import Engine, EventKind, Guest, Snapshot, lib
from .sandbox import Sandbox

log = logging.getLogger(__name__)

# What a template's files hold: FORMAT is this module's layout (manifest.json, the file names),
# state_format() the engine's layout of state.bin (STATE_FORMAT in native/snapshot_file.c). Both are
# part of the key, so a template of another layout is stale and rebuilt, never misread.
FORMAT = 1
DEFAULT_NAME = "default"
DEFAULT_MEMORY = 1 << 30   # of templates whose manifest predates the memory field
BUILD_TIMEOUT = 300.0
LOCK_WAIT = 2 * BUILD_TIMEOUT  # a builder that holds the lock longer than this is stuck
LOCK_PROGRESS_EVERY = 5.0  # seconds between "still waiting" lines while another process builds
# where ZEROBOOT_TEST_BUILD_PAUSE can stop a builder: it holds the lock (locked); the guest has booted
# (booted); memory.img and state.bin are in the hidden build directory (saved); the manifest too,
# just before the publishing rename (manifest)
BUILD_STAGES = ("locked", "booted", "saved", "manifest")
TEST_PAUSE_VARIABLE = "ZEROBOOT_TEST_BUILD_PAUSE"
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
AGENT = GUEST_DIR / "_zeroboot_agent"  # a package run as a directory (its __main__.py)


def default_preload() -> tuple[str, ...]:
    """numpy always; pandas and matplotlib when installed (the demo notebooks use them)."""
    wanted = ["numpy"]
    wanted += [name for name in ("pandas", "matplotlib") if importlib.util.find_spec(name) is not None]
    return tuple(wanted)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zeroboot-kernel" / "templates"


def check_name(name: str) -> str:
    """Template names become file names: letters, digits, '_' and '-' only."""
    if not NAME_RE.fullmatch(name):
        raise TemplateError(f"bad template name {name!r}: use up to 64 letters, digits, '_' and '-'")
    return name


def private_cache_root() -> Path:
    """cache_root(), created 0700 if missing; TemplateError if it belongs to another user or others
    may write to it (a template is loaded into this process's VMs: only its owner may make one)."""
    root = cache_root()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = root.stat()
    except OSError as exc:
        raise TemplateError(f"cannot create the template cache {root}: {exc.strerror}; set XDG_CACHE_HOME "
                            f"to a directory of yours") from None
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TemplateError(f"the template cache {root} belongs to uid {st.st_uid} or is writable by others; "
                            f"each user needs a cache of their own (set XDG_CACHE_HOME)")
    return root


@contextlib.contextmanager
def build_lock(name: str, say: Callable[[str], None], wait: float = LOCK_WAIT) -> Iterator[Path]:
    """Hold the exclusive build lock of template `name` (see the module docstring); yields the
    lock file's path. The holder may unlink the lock file (`template rm`): whoever then acquires
    the old, unlinked file notices and locks the new one instead."""
    path = private_cache_root() / f".{check_name(name)}.lock"
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            _flock_until(fd, name, path, deadline, say)
            st = os.fstat(fd)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is None or (current.st_dev, current.st_ino) != (st.st_dev, st.st_ino):
                continue  # removed while we waited: lock the file that is there now
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield path
            return
        finally:
            os.close(fd)  # releases the lock


def _flock_until(fd: int, name: str, path: Path, deadline: float, say: Callable[[str], None]) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    say(f"template {name!r}: process {holder} is building it; waiting for it")
    started = time.monotonic()
    next_note = started + LOCK_PROGRESS_EVERY
    while True:
        time.sleep(0.1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            now = time.monotonic()
            if now > deadline:
                raise TemplateError(f"template {name!r}: process {holder} has been building it for too long; "
                                    f"stop it or remove {path}") from None
            if now >= next_note:  # a kernel that waits says why, so nobody takes it for hung
                say(f"template {name!r}: still waiting for process {holder} to finish building it "
                    f"({now - started:.0f} s so far)")
                next_note = now + LOCK_PROGRESS_EVERY


@contextlib.contextmanager
def publish_lock(shared: bool) -> Iterator[None]:
    """A flock on the cache directory: exclusive while a template directory is renamed into or
    out of place, shared while one is loaded. Held for milliseconds either way (no build runs
    under it), so it never keeps a kernel waiting for a build of another template."""
    fd = os.open(private_cache_root(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _test_pause(stage: str, name: str, say: Callable[[str], None]) -> None:
    """Stop here while ZEROBOOT_TEST_BUILD_PAUSE names this stage, until SIGUSR1 (see the module
    docstring). SIGUSR1 is blocked before the line is said, so a signal sent on reading it is
    never lost (nor fatal)."""
    if os.environ.get(TEST_PAUSE_VARIABLE) != stage:
        return
    wake = {signal.SIGUSR1}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, wake)
    try:
        say(f"template {name!r}: paused at stage {stage!r} ({TEST_PAUSE_VARIABLE}); SIGUSR1 continues")
        signal.sigwait(wake)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def state_format() -> int:
    """The layout version of state.bin that this engine writes and reads."""
    return int(lib.zb_snapshot_format())


@lru_cache(maxsize=1)
def _native_build_id() -> str:
    from . import _native
    return hashlib.sha256(Path(_native.__file__).read_bytes()).hexdigest()[:16]


def _name_version(metadata: str) -> str:
    """`name==version` from the header of a distribution's metadata file. Parsing the whole file
    as an e-mail (what importlib.metadata's `dist.metadata` does, long descriptions included) took
    0.15-0.3 s for ~170 distributions, on the path of every engine start."""
    try:
        with open(metadata, encoding="utf-8", errors="replace") as f:
            header = f.read(64 * 1024).split("\n\n", 1)[0]
    except OSError:
        header = ""
    fields = dict(re.findall(r"^(Name|Version):[ \t]*(.*?)[ \t]*$", header, re.MULTILINE))
    return f"{fields.get('Name', '')}=={fields.get('Version', '')}"


def installed_distributions() -> list[str]:
    """`name==version` of every distribution in the folders of sys.path, found where
    importlib.metadata.distributions() finds them (a `*.dist-info` folder, an `*.egg-info` folder
    or file). Read here, not through importlib.metadata: importing it (email, zipfile, csv,
    inspect: ~3 MiB) would cost every engine process that memory for this one list."""
    found = []
    for folder in sys.path:
        try:
            with os.scandir(folder or ".") as entries:
                listed = [(e.name.lower(), e.path, e.is_dir()) for e in entries]
        except OSError:  # a zip file, a folder that does not exist
            continue
        for name, path, is_dir in listed:
            if name.endswith(".dist-info") and is_dir:
                found.append(_name_version(os.path.join(path, "METADATA")))
            elif name.endswith(".egg-info"):
                found.append(_name_version(os.path.join(path, "PKG-INFO") if is_dir else path))
    return sorted(found)


@lru_cache(maxsize=1)
def _environment_id() -> str:
    dists = installed_distributions()
    agent = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(AGENT.glob("*.py")))).hexdigest()
    return hashlib.sha256(json.dumps([dists, list(python_view()), system_view(), locale_view(), agent]).encode()).hexdigest()


@dataclass(frozen=True)
class TemplateConfig:
    name: str = DEFAULT_NAME
    preload: tuple[str, ...] = ()
    memory: int = field(default_factory=default_memory)  # follows the host (guest_memory_size.py)

    def key(self, engine: Engine) -> str:
        parts = {
            "format": FORMAT,
            "state_format": state_format(),
            "zeroboot": __version__,
            "native": _native_build_id(),
            "python": [sys.version, os.path.realpath(sys.executable)],
            "environment": _environment_id(),
            "preload": list(self.preload),
            "memory": self.memory,
            # variables numeric libraries read when the template imports them (OPENBLAS_CORETYPE)
            "variables": template_environment(),
            "cpu": int(lib.zb_engine_fingerprint(engine.handle)),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def directory(self, engine: Engine) -> Path:
        return cache_root() / f"{self.name}-{self.key(engine)[:16]}"


class Template:
    """A loaded template: fork sandboxes from it (see zeroboot_kernel.engine)."""

    def __init__(self, directory: Path, manifest: dict[str, Any], snapshot: Snapshot) -> None:
        self.directory = directory
        self.manifest = manifest
        self.snapshot = snapshot

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    def fork(self) -> Sandbox:
        """A new sandbox starting from this template (copy-on-write; nothing is copied now)."""
        return Sandbox(self.snapshot.fork(), self, fresh=True)

    @property
    def ready(self) -> dict[str, Any]:
        """The agent's READY payload: language_info, python version, preloaded modules."""
        return dict(self.manifest.get("ready", {}))

    @classmethod
    def load(cls, name: str = DEFAULT_NAME, engine: Engine | None = None, memory: int | None = None) -> Template:
        """The current template called `name` (of `memory` bytes of guest memory, if given);
        TemplateError if it is missing, stale or corrupt."""
        engine = engine or Engine.default()
        check_name(name)
        candidates = [d for d in _list_dirs() if d.name.rsplit("-", 1)[0] == name and
                      (memory is None or (_read_manifest(d) or {}).get("memory") == memory)]
        if not candidates:
            raise TemplateError(f"there is no template {name!r} yet: build it with "
                                f"`zeroboot-kernel template build --name {name}`")
        for d in candidates:
            # under the shared publish lock nothing renames d while its files are read, so a
            # failure to read them means the template is corrupt, not that it is being replaced
            with publish_lock(shared=True):
                manifest = _read_manifest(d)
                if manifest is None:
                    continue  # gone since it was listed (replaced or removed), or corrupt
                config = TemplateConfig(name, tuple(manifest.get("preload", ())),
                                        int(manifest.get("memory", DEFAULT_MEMORY)))
                if manifest.get("key") == config.key(engine) and d == config.directory(engine):
                    return cls.open(d, manifest, engine)
        raise TemplateError(f"template {name!r} is stale (it was built for another version of this package, "
                            f"its Python environment or this machine's CPU): rebuild it with "
                            f"`zeroboot-kernel template build --name {name}`")

    @classmethod
    def open(cls, directory: Path, manifest: dict[str, Any], engine: Engine | None = None) -> Template:
        try:
            snapshot = Snapshot.load(str(directory), engine)
        except SandboxError as exc:
            raise TemplateError(f"template at {directory} is corrupt ({exc}): rebuild it with "
                                f"`zeroboot-kernel template build --name {manifest.get('name', DEFAULT_NAME)}`") from None
        return cls(directory, manifest, snapshot)

    @classmethod
    def build(cls, config: TemplateConfig | None = None, engine: Engine | None = None,
              progress: Callable[[str], None] | None = None) -> Template:
        """Boot the agent, let it import the preload modules, snapshot it and store the template
        (waits while another process builds the same name, then builds anew)."""
        config = config or TemplateConfig(preload=default_preload())
        engine = engine or Engine.default()
        say = progress or (lambda msg: log.info("%s", msg))
        with build_lock(config.name, say):
            _test_pause("locked", config.name, say)
            return cls._build_locked(config, engine, say)

    @classmethod
    def ensure(cls, config: TemplateConfig | None = None, engine: Engine | None = None,
               progress: Callable[[str], None] | None = None) -> Template:
        """Load the template, building it first if it is missing, stale or corrupt. When several
        processes ensure the same template at once, one builds and the others load its result."""
        config = config or TemplateConfig(preload=default_preload())
        engine = engine or Engine.default()
        say = progress or (lambda msg: log.info("%s", msg))
        try:
            return cls.load(config.name, engine, memory=config.memory)
        except TemplateError as exc:
            say(f"{exc}; building it now")
        with build_lock(config.name, say):
            try:  # built by the process we waited for?
                return cls.load(config.name, engine, memory=config.memory)
            except TemplateError:
                pass
            _test_pause("locked", config.name, say)
            return cls._build_locked(config, engine, say)

    @classmethod
    def _build_locked(cls, config: TemplateConfig, engine: Engine, say: Callable[[str], None]) -> Template:
        root = private_cache_root()
        _remove_leftovers(root, config.name)
        target = config.directory(engine)
        t0 = time.monotonic()
        say(f"template {config.name!r}: booting Python in a VM and importing {', '.join(config.preload) or 'nothing'}")
        spec = python_spec([str(AGENT), "--preload", ",".join(config.preload)], mem_bytes=config.memory,
                           env=template_environment())
        with Guest.boot(spec, engine) as guest:
            ready = _boot_until_ready(guest, time.monotonic() + BUILD_TIMEOUT)
            booted = time.monotonic() - t0
            say(f"template {config.name!r}: agent ready after {booted:.2f} s; capturing the snapshot")
            _test_pause("booted", config.name, say)
            snapshot = guest.snapshot()
        # the build directory is in the cache itself: the same file system, so publishing is a rename
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{config.name}.", dir=root))
        try:
            snapshot.save(str(tmp))
            _test_pause("saved", config.name, say)
            manifest: dict[str, Any] = {
                "name": config.name,
                "key": config.key(engine),
                "format": FORMAT,
                "state_format": state_format(),
                "preload": list(config.preload),
                "memory": config.memory,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "zeroboot_version": __version__,
                "python": sys.version.split()[0],
                "executable": sys.executable,
                "environment": os.path.realpath(sys.prefix),
                "boot_seconds": round(booted, 3),
                "build_seconds": round(time.monotonic() - t0, 3),
                "image_bytes_on_disk": os.stat(tmp / "memory.img").st_blocks * 512,
                "ready": ready,
            }
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
            _test_pause("manifest", config.name, say)
            for old in _list_dirs():  # older builds of this name for this same environment
                if old != target and old.name.rsplit("-", 1)[0] == config.name and _outdated(old, manifest, engine):
                    _discard(old, root, config.name)
            _publish(tmp, target, root, config.name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        say(f"template {config.name!r}: built in {manifest['build_seconds']:.2f} s "
            f"({manifest['image_bytes_on_disk'] >> 20} MiB of memory image) at {target}")
        snapshot.release()
        return cls.open(target, manifest, engine)


def _outdated(directory: Path, built: dict[str, Any], engine: Engine) -> bool:
    """Whether the published template in `directory` is one the build `built` replaces: one of
    the same environment (another environment's kernels may still use theirs) that is stale or
    unreadable. A current template of the same name for another memory size stays: kernels of
    that size use it."""
    m = _read_manifest(directory)
    if m is None:
        return True
    if m.get("environment") not in (None, built["environment"]):
        return False
    config = TemplateConfig(str(m.get("name", "")), tuple(m.get("preload", ())), int(m.get("memory", DEFAULT_MEMORY)))
    return m.get("key") != config.key(engine) or directory != config.directory(engine)


def _move_aside(directory: Path, root: Path, name: str) -> Path:
    """Rename a published template out of sight (the caller holds the exclusive publish lock);
    returns the hidden directory to delete."""
    aside = Path(tempfile.mkdtemp(prefix=f".old-{name}.", dir=root))
    try:
        os.rename(directory, aside / directory.name)
    except FileNotFoundError:
        pass
    return aside


def _discard(directory: Path, root: Path, name: str) -> None:
    """Remove a published template: first renamed out of sight (one step, under the publish
    lock, so a loader sees it whole or not at all), then deleted. Processes that loaded it keep
    their mapping."""
    with publish_lock(shared=False):
        aside = _move_aside(directory, root, name)
    shutil.rmtree(aside, ignore_errors=True)


def _publish(tmp: Path, target: Path, root: Path, name: str) -> None:
    """Make the finished build in `tmp` the template at `target` with one rename; a template of
    the same key already there (`template build`, or a corrupt one) is moved aside in the same
    exclusive step, so no loader sees the path missing or half of either."""
    aside = None
    with publish_lock(shared=False):
        if target.exists():
            aside = _move_aside(target, root, name)
        os.rename(tmp, target)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _remove_leftovers(root: Path, name: str) -> None:
    """Builds and discards of `name` that a killed process left behind (the caller holds the
    lock of `name`, so none of them is in progress)."""
    for d in root.iterdir():
        if d.name.startswith((f".build-{name}.", f".old-{name}.")):
            log.info("removing %s, left behind by a builder that did not finish", d)
            shutil.rmtree(d, ignore_errors=True)


def _boot_until_ready(guest: Guest, deadline: float) -> dict[str, Any]:
    """Run the freshly booted agent until it has sent READY and waits for its first request."""
    ready: dict[str, Any] | None = None
    console = bytearray()
    while True:
        ev = guest.run(deadline)
        if ev.kind is EventKind.OUTPUT:
            console += ev.data
            if len(console) > 65536:
                del console[:-65536]
        elif ev.kind is EventKind.FRAME and ev.frame_type == frames.FrameType.READY:
            ready = frames.decode_payload(ev.data)
        elif ev.kind is EventKind.INPUT and ready is not None:
            if console:
                log.debug("agent start-up output: %s", console.decode(errors="replace"))
            return ready
        elif ev.kind is EventKind.KICK:
            continue
        else:
            what = ev.message or f"{ev.kind.name} (status {ev.status})"
            tail = console.decode(errors="replace")[-2000:]
            raise TemplateError(f"the guest agent did not start: {what}\n{tail}")


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / "manifest.json").read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _list_dirs() -> list[Path]:
    root = cache_root()
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


def list_templates(engine: Engine | None = None) -> list[dict[str, Any]]:
    """Every template in the cache, with `status` current, stale or corrupt."""
    engine = engine or Engine.default()
    out = []
    for d in _list_dirs():
        manifest = _read_manifest(d)
        if manifest is None or not (d / "memory.img").exists() or not (d / "state.bin").exists():
            out.append({"name": d.name.rsplit("-", 1)[0], "directory": str(d), "status": "corrupt"})
            continue
        config = TemplateConfig(manifest.get("name", ""), tuple(manifest.get("preload", ())), int(manifest.get("memory", DEFAULT_MEMORY)))
        current = manifest.get("key") == config.key(engine)
        out.append({**manifest, "directory": str(d), "status": "current" if current else "stale"})
    return out


def remove_template(name: str) -> list[str]:
    """Delete every version of template `name` and its lock (waiting for a builder of it to
    finish); returns the directories removed."""
    removed = []
    with build_lock(name, lambda msg: log.warning("%s", msg)) as lock:
        root = lock.parent
        _remove_leftovers(root, name)
        for d in _list_dirs():
            if d.name.rsplit("-", 1)[0] == name:
                _discard(d, root, name)
                removed.append(str(d))
        lock.unlink()
    return removed
