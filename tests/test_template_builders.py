"""Concurrent template builders (issue 18 item 0): on an empty cache one process builds and the
others wait and load its result; a builder killed halfway leaves nothing that blocks the next."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
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


@pytest.mark.kvm
def test_kernels_started_at_once_build_the_template_once(cache: Path) -> None:
    """Three `zeroboot-kernel run` on an empty cache: one build, all three run, nothing left over."""
    cmd = [sys.executable, "-m", "zeroboot_kernel", "run", "-c", "print(6*7)"]
    results = _start_all([cmd] * 3, cache)
    for r in results:
        assert r.returncode == 0 and r.stdout == "42\n", r.stderr
    builds = [r for r in results if "built in" in r.stderr]
    assert len(builds) == 1, [r.stderr for r in results]
    names = sorted(p.name for p in _templates(cache).iterdir())
    assert len(names) == 2 and names[0] == ".default.lock" and names[1].startswith("default-"), names
    _assert_unlocked(_templates(cache) / ".default.lock")


@pytest.mark.kvm
def test_builder_killed_halfway_blocks_nobody(cache: Path) -> None:
    root = _templates(cache)
    builder = subprocess.Popen([sys.executable, "-c", BUILD], env=_env(cache), stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(600, builder.kill)
    watchdog.start()
    try:
        assert builder.stderr is not None
        for line in builder.stderr:
            if "booting Python" in line:  # it holds the lock and is halfway through
                break
        else:
            pytest.fail(f"the builder ended before booting (rc {builder.wait()})")
        with pytest.raises(BlockingIOError):
            _assert_unlocked(root / ".t.lock")
        builder.send_signal(signal.SIGKILL)
        assert builder.wait() == -signal.SIGKILL
    finally:
        watchdog.cancel()
        builder.kill()
    # what a builder killed while saving leaves: a half-written hidden build directory
    half = root / ".build-t.k1ll3d"
    half.mkdir()
    (half / "memory.img").write_bytes(b"\0" * 4096)
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
