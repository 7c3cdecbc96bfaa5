"""Templates: a snapshot of the guest agent after it imported numpy & co, stored on disk.

A template lives in $XDG_CACHE_HOME/zeroboot-kernel/templates/<name>-<key>/ as memory.img (all of
guest memory, sparse), state.bin (everything else) and manifest.json. The key hashes everything
the snapshot depends on: this package and its native build, the interpreter, the installed
distributions, the preload list, guest memory size and the host's KVM CPU model. A template whose
key no longer matches is stale and is never used; building writes a new one.
"""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from . import __version__, frames
from .errors import SandboxError, TemplateError
from .guest_environ import template_environment
from .guest_memory_size import default_memory
from .guest_view import GUEST_DIR, locale_view, python_spec, python_view
from .native import Engine, EventKind, Guest, Snapshot, lib
from .sandbox import Sandbox

log = logging.getLogger(__name__)

FORMAT = 1
DEFAULT_NAME = "default"
DEFAULT_MEMORY = 1 << 30   # of templates whose manifest predates the memory field
BUILD_TIMEOUT = 300.0
AGENT = GUEST_DIR / "_zeroboot_agent"  # a package run as a directory (its __main__.py)


def default_preload() -> tuple[str, ...]:
    """numpy always; pandas and matplotlib when installed (the demo notebooks use them)."""
    wanted = ["numpy"]
    for name in ("pandas", "matplotlib"):
        try:
            importlib.metadata.distribution(name)
            wanted.append(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return tuple(wanted)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zeroboot-kernel" / "templates"


@lru_cache(maxsize=1)
def _native_build_id() -> str:
    from . import _native
    return hashlib.sha256(Path(_native.__file__).read_bytes()).hexdigest()[:16]


@lru_cache(maxsize=1)
def _environment_id() -> str:
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    agent = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(AGENT.glob("*.py")))).hexdigest()
    return hashlib.sha256(json.dumps([dists, list(python_view()), locale_view(), agent]).encode()).hexdigest()


@dataclass(frozen=True)
class TemplateConfig:
    name: str = DEFAULT_NAME
    preload: tuple[str, ...] = ()
    memory: int = field(default_factory=default_memory)  # follows the host (guest_memory_size.py)

    def key(self, engine: Engine) -> str:
        parts = {
            "format": FORMAT,
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
        candidates = [d for d in _list_dirs() if d.name.rsplit("-", 1)[0] == name and
                      (memory is None or (_read_manifest(d) or {}).get("memory") == memory)]
        if not candidates:
            raise TemplateError(f"there is no template {name!r} yet: build it with "
                                f"`zeroboot-kernel template build --name {name}`")
        for d in candidates:
            manifest = _read_manifest(d)
            if manifest is None:
                continue
            config = TemplateConfig(name, tuple(manifest.get("preload", ())), int(manifest.get("memory", DEFAULT_MEMORY)))
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
        """Boot the agent, let it import the preload modules, snapshot it and store the template."""
        config = config or TemplateConfig(preload=default_preload())
        engine = engine or Engine.default()
        say = progress or (lambda msg: log.info("%s", msg))
        target = config.directory(engine)
        t0 = time.monotonic()
        say(f"template {config.name!r}: booting Python in a VM and importing {', '.join(config.preload) or 'nothing'}")
        spec = python_spec([str(AGENT), "--preload", ",".join(config.preload)], mem_bytes=config.memory,
                           env=template_environment())
        with Guest.boot(spec, engine) as guest:
            ready = _boot_until_ready(guest, time.monotonic() + BUILD_TIMEOUT)
            booted = time.monotonic() - t0
            say(f"template {config.name!r}: agent ready after {booted:.2f} s; capturing the snapshot")
            snapshot = guest.snapshot()
        cache_root().mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{config.name}-", dir=cache_root()))
        try:
            snapshot.save(str(tmp))
            manifest = {
                "name": config.name,
                "key": config.key(engine),
                "format": FORMAT,
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
            for old in _list_dirs():  # older builds of this name for this same environment
                m = _read_manifest(old) or {}
                if old != target and old.name.rsplit("-", 1)[0] == config.name and \
                        m.get("environment") in (None, manifest["environment"]):
                    shutil.rmtree(old, ignore_errors=True)
            if target.exists():
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        say(f"template {config.name!r}: built in {manifest['build_seconds']:.2f} s "
            f"({manifest['image_bytes_on_disk'] >> 20} MiB of memory image) at {target}")
        snapshot.release()
        return cls.open(target, manifest, engine)

    @classmethod
    def ensure(cls, config: TemplateConfig | None = None, engine: Engine | None = None,
               progress: Callable[[str], None] | None = None) -> Template:
        """Load the template, building it first if it is missing, stale or corrupt."""
        config = config or TemplateConfig(preload=default_preload())
        engine = engine or Engine.default()
        try:
            return cls.load(config.name, engine, memory=config.memory)
        except TemplateError as exc:
            (progress or log.info)(f"{exc}; building it now")
            return cls.build(config, engine, progress)


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
    """Delete every version of template `name`; returns the directories removed."""
    removed = []
    for d in _list_dirs():
        if d.name.rsplit("-", 1)[0] == name:
            shutil.rmtree(d)
            removed.append(str(d))
    return removed
