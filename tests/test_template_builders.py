"""Concurrent template builders (issue 18 item 0): on an empty cache one process builds and the
others wait and load its result; a builder killed halfway leaves nothing that blocks the next; a
loader never takes a template being built or replaced for a corrupt one.

Builders are stopped at exact stages with ZEROBOOT_TEST_BUILD_PAUSE (template.py): the test reads
the builder's "paused at stage" line, then kills it or sends SIGUSR1. No sleeps decide anything."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.without_kvm  # the cache's rules; the tests that build a template say `kvm`

ENSURE = """
import sys
from zeroboot_kernel.template import Template, TemplateConfig
say = lambda m: print(m, file=sys.stderr, flush=True)
t = Template.ensure(TemplateConfig("t", ("numpy",)), progress=say)
with t.fork() as sb:
    r = sb.execute("6*7")
print(t.directory, r.result["text/plain"], flush=True)
"""

BUILD = """
import sys
from zeroboot_kernel.template import Template, TemplateConfig
Template.build(TemplateConfig("t", ("numpy",)), progress=lambda m: print(m, file=sys.stderr, flush=True))
"""


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(cache)}


def _templates(cache: Path) -> Path:
    return cache / "zeroboot-kernel" / "templates"


def _start_all(cmds: list[list[str]], cache: Path) -> list[subprocess.CompletedProcess[str]]:
    procs = [subprocess.Popen(cmd, env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in cmds]
    results = []
    for cmd, p in zip(cmds, procs):
        out, err = p.communicate(timeout=900)
        results.append(subprocess.CompletedProcess(cmd, p.returncode, out, err))
    return results


def _assert_unlocked(lock: Path) -> None:
    with open(lock, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if anyone holds it


@contextlib.contextmanager
def _paused_builder(cache: Path, stage: str) -> Iterator[subprocess.Popen[str]]:
    """A `Template.build` of "t" stopped at `stage` (ZEROBOOT_TEST_BUILD_PAUSE); killed on exit."""
    env = {**_env(cache), "ZEROBOOT_TEST_BUILD_PAUSE": stage}
    builder = subprocess.Popen([sys.executable, "-c", BUILD], env=env, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(600, builder.kill)  # a hung build fails the test instead of hanging it
    watchdog.start()
    try:
        assert builder.stderr is not None
        seen = []
        for line in builder.stderr:
            seen.append(line)
            if f"paused at stage {stage!r}" in line:
                break
        else:
            pytest.fail(f"the builder ended before stage {stage} (rc {builder.wait()}):\n{''.join(seen)}")
        yield builder
    finally:
        watchdog.cancel()
        builder.kill()
        builder.wait()


@pytest.mark.kvm
def test_kernels_started_at_once_build_the_template_once(cache: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight Jupyter kernels (kernel and engine processes, as JupyterLab starts them) on an empty
    cache at the same moment: one builds while seven wait for it and say so, then all eight run
    cells; the cache holds one template and a free lock afterwards. The builder is held at its
    first stage until the seven are seen waiting, so the test does not depend on who is faster."""
    from jupyter_client.manager import KernelManager

    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "zeroboot_kernel", "install", "--prefix", str(prefix), "--no-template"],
                   check=True, capture_output=True, timeout=120)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("ZEROBOOT_TEST_BUILD_PAUSE", "locked")
    logs = [tmp_path / f"kernel{i}.log" for i in range(8)]
    managers, clients = [], []
    try:
        for log_path in logs:
            km = KernelManager(kernel_name="zeroboot")
            with open(log_path, "w") as log_file:
                km.start_kernel(stderr=log_file, stdout=log_file)
            managers.append(km)
        deadline = time.monotonic() + 600  # a functional bound: the condition, not the clock, decides
        while True:
            texts = [p.read_text() for p in logs]
            paused = [t for t in texts if "paused at stage 'locked'" in t]
            waiting = [t for t in texts if "is building it; waiting for it" in t]
            if len(paused) == 1 and len(waiting) == 7:
                break
            assert len(paused) <= 1 and time.monotonic() < deadline, texts
            time.sleep(0.2)
        builder = int((_templates(cache) / ".default.lock").read_text())
        os.kill(builder, signal.SIGUSR1)  # the engine process holding the lock: build now
        for km in managers:
            kc = km.client()
            kc.start_channels()
            clients.append(kc)
            kc.wait_for_ready(timeout=300)
        for i, kc in enumerate(clients):
            printed: list[str] = []
            reply = kc.execute_interactive(f"print({i} * 7)", timeout=600, output_hook=lambda msg: printed.append(
                msg["content"].get("text", "")) if msg["msg_type"] == "stream" else None)
            assert reply["content"]["status"] == "ok", (reply["content"], logs[i].read_text())
            assert "".join(printed) == f"{i * 7}\n"
    finally:
        for kc in clients:
            kc.stop_channels()
        for km in managers:
            km.shutdown_kernel(now=True)
    texts = [p.read_text() for p in logs]
    assert sum("built in" in t for t in texts) == 1, texts
    assert not any("corrupt" in t for t in texts), texts
    names = sorted(p.name for p in _templates(cache).iterdir())
    assert len(names) == 2 and names[0] == ".default.lock" and names[1].startswith("default-"), names
    _assert_unlocked(_templates(cache) / ".default.lock")


@pytest.mark.kvm
@pytest.mark.parametrize("stage", ["saved", "manifest"])
def test_builder_killed_halfway_blocks_nobody(cache: Path, stage: str) -> None:
    """SIGKILL a builder once its hidden build directory holds the memory image and state
    ("saved") or everything but the publishing rename ("manifest"): nothing is published, the lock
    is free, and the next two loaders build once, remove the leftovers and both run."""
    root = _templates(cache)
    with _paused_builder(cache, stage) as builder:
        with pytest.raises(BlockingIOError):
            _assert_unlocked(root / ".t.lock")
        (half,) = [p for p in root.iterdir() if p.name.startswith(".build-t.")]
        assert (half / "memory.img").exists() and (half / "state.bin").exists()
        assert (half / "manifest.json").exists() == (stage == "manifest")
        builder.send_signal(signal.SIGKILL)
        assert builder.wait() == -signal.SIGKILL
    _assert_unlocked(root / ".t.lock")
    assert not [p for p in root.iterdir() if not p.name.startswith(".")]  # nothing was published

    results = _start_all([[sys.executable, "-c", ENSURE]] * 2, cache)
    for r in results:
        assert r.returncode == 0 and r.stdout.split()[1] == "42", r.stderr
    assert len({r.stdout.split()[0] for r in results}) == 1
    assert sum("built in" in r.stderr for r in results) == 1, [r.stderr for r in results]
    names = sorted(p.name for p in root.iterdir())
    assert len(names) == 2 and names[0] == ".t.lock" and names[1].startswith("t-"), names
    _assert_unlocked(root / ".t.lock")


@pytest.mark.kvm
def test_loader_during_a_rebuild_never_sees_it_corrupt(cache: Path) -> None:
    """A rebuild of a template (`template build` of a current one) stopped just before it
    publishes: a loader then gets the published template, whole; once the rebuild publishes
    (SIGUSR1), a loader gets the new one; nobody ever reads a template as corrupt."""
    first = subprocess.run([sys.executable, "-c", ENSURE], env=_env(cache), capture_output=True, text=True,
                           timeout=900)
    assert first.returncode == 0, first.stderr
    published = Path(first.stdout.split()[0])
    old_inode = published.stat().st_ino
    with _paused_builder(cache, "manifest") as builder:
        during = subprocess.run([sys.executable, "-c", ENSURE], env=_env(cache), capture_output=True, text=True,
                                timeout=900)
        assert during.returncode == 0 and during.stdout.split()[1] == "42", during.stderr
        assert "building" not in during.stderr and "corrupt" not in during.stderr, during.stderr
        assert published.stat().st_ino == old_inode  # the old template is still the published one
        builder.send_signal(signal.SIGUSR1)
        assert builder.wait(timeout=600) == 0
    after = subprocess.run([sys.executable, "-c", ENSURE], env=_env(cache), capture_output=True, text=True,
                           timeout=900)
    assert after.returncode == 0 and "building" not in after.stderr, after.stderr
    assert during.stdout.split()[0] == after.stdout.split()[0] == str(published)  # same key, same path
    assert published.stat().st_ino != old_inode  # ... now the rebuild's directory
    names = sorted(p.name for p in _templates(cache).iterdir())
    assert len(names) == 2 and names[0] == ".t.lock" and names[1].startswith("t-"), names


@pytest.mark.kvm
def test_template_rm_while_others_wait_keeps_one_builder(cache: Path) -> None:
    """`template rm` unlinks the lock file; a process that waited on the old file must not build
    next to one that locked the new file."""
    from zeroboot_kernel import template as tmod

    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        say: list[str] = []
        with tmod.build_lock("t", say.append) as lock:
            waiter = subprocess.Popen([sys.executable, "-c", ENSURE], env=_env(cache), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            assert waiter.stderr is not None
            for line in waiter.stderr:
                if "waiting for it" in line:
                    break
            lock.unlink()  # what remove_template does while holding it
            second = subprocess.Popen([sys.executable, "-c", ENSURE], env=_env(cache), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
        out1, err1 = waiter.communicate(timeout=900)
        out2, err2 = second.communicate(timeout=900)
    finally:
        del os.environ["XDG_CACHE_HOME"]
    assert waiter.returncode == 0 and second.returncode == 0, err1 + err2
    assert out1.split()[0] == out2.split()[0]
    assert ("built in" in err1) + ("built in" in err2) == 1, err1 + err2


def test_renames_happen_under_the_exclusive_publish_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Publishing over an existing template and discarding one rename while holding the cache's
    exclusive flock, so a loader (shared flock) never reads a directory that is being swapped."""
    from zeroboot_kernel import template as tmod

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmod.private_cache_root()
    seen: list[str] = []
    real_rename = os.rename

    def checked_rename(src: Path, dst: Path) -> None:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            seen.append("unlocked")
        except BlockingIOError:
            seen.append("locked")
        finally:
            os.close(fd)
        real_rename(src, dst)

    monkeypatch.setattr(tmod.os, "rename", checked_rename)
    target = root / "t-0123456789abcdef"
    for content in ("old", "new"):
        build = root / f".build-t.{content}"
        build.mkdir()
        (build / "manifest.json").write_text(content)
        tmod._publish(build, target, root, "t")
    assert (target / "manifest.json").read_text() == "new"
    tmod._discard(target, root, "t")
    assert seen == ["locked"] * 4, seen  # publish, move aside + publish, discard
    assert os.listdir(root) == []  # the old versions were deleted after the lock was released
    with tmod.publish_lock(shared=True):  # a loader's lock is free again
        pass


@pytest.mark.kvm
def test_a_build_replaces_stale_templates_but_keeps_other_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels with another ZEROBOOT_MEMORY use a template of the same name and another key: a
    build for one size must not delete the other's (they would rebuild each other's forever)."""
    from zeroboot_kernel import template as tmod
    from zeroboot_kernel.native import Engine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine = Engine.default()
    root = tmod.private_cache_root()
    small, big = tmod.TemplateConfig("t", ("numpy",), 1 << 30), tmod.TemplateConfig("t", ("numpy",), 2 << 30)
    dirs = {}
    for label, config, key in (("small", small, small.key(engine)), ("big", big, big.key(engine)),
                               ("stale", big, "0" * 64)):
        d = root / f"t-{label}" if label == "stale" else config.directory(engine)
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({"name": "t", "key": key, "preload": ["numpy"],
                                                     "memory": config.memory, "environment": "/env"}))
        dirs[label] = d
    built = {"environment": "/env"}
    assert not tmod._outdated(dirs["big"], built, engine)
    assert tmod._outdated(dirs["stale"], built, engine)
    assert not tmod._outdated(dirs["stale"], {"environment": "/another/env"}, engine)
    (dirs["small"] / "manifest.json").write_text("{")  # unreadable: replaced
    assert tmod._outdated(dirs["small"], built, engine)


def test_cache_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zeroboot_kernel import template as tmod
    from zeroboot_kernel.errors import TemplateError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "zeroboot-kernel" / "templates"
    root.mkdir(parents=True)
    root.chmod(0o777)
    with pytest.raises(TemplateError, match="cache of their own"):
        tmod.private_cache_root()
    root.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(root, 65534, 65534)
        with pytest.raises(TemplateError, match="belongs to uid 65534"):
            tmod.private_cache_root()


@pytest.mark.parametrize("name", ["", "../x", ".hidden", "a/b", "x" * 65, "na me"])
def test_bad_template_names_are_refused(name: str) -> None:
    from zeroboot_kernel import template as tmod
    from zeroboot_kernel.errors import TemplateError

    with pytest.raises(TemplateError, match="bad template name"):
        tmod.check_name(name)
