"""Shared helpers of the kernel tests (tests/test_kernel_*.py): kernelspecs in a private prefix,
kernels through jupyter_client, execute with all of a request's IOPub messages, process checks.

The kernelspecs are installed once per test process with `zeroboot-kernel install --prefix`,
which also builds the template, into a private XDG_CACHE_HOME: the tests never depend on (or
disturb) the user's template cache, and the CLI's install path is exercised on the way.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from queue import Empty
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
TIMEOUT = 60.0          # generous functional timeout for one request
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    return ANSI.sub("", text)


@lru_cache(maxsize=1)
def ensure_kernelspecs() -> Path:
    """Install both kernelspecs (and build the template) once; point Jupyter and the template
    cache at private directories for this process and the kernels it starts."""
    root = Path(tempfile.mkdtemp(prefix="zeroboot-kernel-tests-"))
    atexit.register(shutil.rmtree, root, True)
    os.environ["XDG_CACHE_HOME"] = str(root / "cache")
    proc = subprocess.run([sys.executable, "-m", "zeroboot_kernel", "install", "--prefix", str(root)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"zeroboot-kernel install failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(root / "share" / "jupyter"), *filter(None, os.environ.get("JUPYTER_PATH", "").split(os.pathsep))])
    return root


@contextlib.contextmanager
def kernel(name: str = "zeroboot", **env: str) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """A running kernel and a started blocking client; shut down cleanly afterwards."""
    km = manager(name, **env)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=TIMEOUT)
        yield km, kc
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=False)
        else:
            km.cleanup_resources()


def manager(name: str = "zeroboot", **env: str) -> KernelManager:
    """A KernelManager for one of our kernelspecs, with kernelspec env overrides (the kernelspec's
    "env" wins over the environment a client passes, so overrides go into the spec itself)."""
    ensure_kernelspecs()
    km = KernelManager(kernel_name=name)
    km.kernel_spec.env.update(env)  # type: ignore[union-attr]
    return km


def kernel_pid(km: KernelManager) -> int:
    return int(km.provisioner.process.pid)  # type: ignore[union-attr]


def collect(kc: BlockingKernelClient, msg_id: str, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
    """Every IOPub message of request msg_id, from busy up to and including idle."""
    msgs: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no idle status for {msg_id} within {timeout} s; got {[m['msg_type'] for m in msgs]}")
        try:
            msg = kc.get_iopub_msg(timeout=remaining)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        msg["_received"] = time.monotonic()
        msgs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return msgs


def shell_reply(kc: BlockingKernelClient, msg_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no shell reply for {msg_id} within {timeout} s")
        try:
            msg = kc.get_shell_msg(timeout=remaining)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


def execute(kc: BlockingKernelClient, code: str, timeout: float = TIMEOUT,
            **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run a cell; returns (execute_reply content, its IOPub messages without the status ones)."""
    msg_id = kc.execute(code, **kwargs)
    msgs = collect(kc, msg_id, timeout)  # first, so that arrival times are those of live messages
    reply = shell_reply(kc, msg_id, timeout)
    return reply["content"], [m for m in msgs if m["msg_type"] not in ("status", "execute_input")]


def result_text(msgs: list[dict[str, Any]]) -> str | None:
    for m in msgs:
        if m["msg_type"] == "execute_result":
            return str(m["content"]["data"].get("text/plain"))
    return None


def stream_text(msgs: list[dict[str, Any]], name: str = "stdout") -> str:
    return "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream" and m["content"]["name"] == name)


def value_of(kc: BlockingKernelClient, expr: str) -> str | None:
    """repr of an expression evaluated in the kernel's current state (None if it raised)."""
    reply, msgs = execute(kc, expr)
    return result_text(msgs) if reply["status"] == "ok" else None


def engine_pids(parent: int | None = None) -> list[int]:
    """Engine processes alive (not zombies), optionally only those of one kernel process."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if b"zeroboot_kernel.engine_server" not in argv or "Z" in state.split()[1]:
            continue
        if parent is not None:
            try:
                if argv[argv.index(b"--parent") + 1] != str(parent).encode():
                    continue
            except (ValueError, IndexError):
                continue
        pids.append(int(entry.name))
    return pids


def process_alive(pid: int) -> bool:
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "Z" not in state.split()[1]


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def engine_pid_of(km: KernelManager, timeout: float = TIMEOUT) -> int:
    """The engine process of a kernel (it starts in the background: wait for it)."""
    pid = kernel_pid(km)
    found: list[int] = []
    assert wait_until(lambda: bool(found.extend(engine_pids(pid)) or found), timeout), "no engine process"
    assert len(set(found)) == 1, f"expected one engine process, found {found}"
    return found[0]
