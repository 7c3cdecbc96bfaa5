"""Kernel lifecycle: restart, shutdown, and what happens when the kernel or its engine dies.
Every test starts its own kernel; processes are checked through /proc."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from kernel_helpers import (TIMEOUT, collect, engine_pid_of, engine_pids, execute, kernel, kernel_pid,
                            manager, process_alive, shell_reply, value_of, wait_until)

GONE_WITHIN = 5.0  # generous: the design target is 1 s


def test_shutdown_leaves_no_processes() -> None:
    with kernel("zeroboot") as (km, kc):
        assert value_of(kc, "1+1") == "2"
        kpid, epid = kernel_pid(km), engine_pid_of(km)
        km.shutdown_kernel(now=False)
        assert wait_until(lambda: not process_alive(epid), GONE_WITHIN), "engine process left behind"
        assert wait_until(lambda: not process_alive(kpid), GONE_WITHIN), "kernel process left behind"
        assert engine_pids(kpid) == []


def test_shutdown_while_a_cell_runs() -> None:
    with kernel("zeroboot") as (km, kc):
        epid = engine_pid_of(km)
        kc.execute("while True: pass")
        time.sleep(0.5)
        t0 = time.monotonic()
        km.shutdown_kernel(now=False)
        assert time.monotonic() - t0 < 10
        assert wait_until(lambda: not process_alive(epid), GONE_WITHIN), "engine process left behind"


def test_exit_in_a_cell_ends_the_kernel_as_ipykernel() -> None:
    """exit() (IPython's ZMQExitAutocall): the reply carries ask_exit and the kernel process ends,
    its engine with it; exit(keep_kernel=True) only asks the frontend."""
    with kernel("zeroboot") as (km, kc):
        reply, _ = execute(kc, "exit(keep_kernel=True)")
        assert reply["status"] == "ok" and reply["payload"] == [{"source": "ask_exit", "keepkernel": True}], reply
        assert value_of(kc, "1+1") == "2"
        kpid, epid = kernel_pid(km), engine_pid_of(km)
        reply, _ = execute(kc, "exit()")
        assert reply["status"] == "ok" and reply["payload"] == [{"source": "ask_exit", "keepkernel": False}], reply
        assert wait_until(lambda: not process_alive(kpid), TIMEOUT), "the kernel did not end"
        assert wait_until(lambda: not process_alive(epid), TIMEOUT), "engine process left behind"


def test_restart_is_clean() -> None:
    with kernel("zeroboot") as (km, kc):
        execute(kc, "before_restart = 1")
        old_kernel, old_engine = kernel_pid(km), engine_pid_of(km)
        km.restart_kernel(now=False)
        kc.wait_for_ready(timeout=TIMEOUT)
        reply, _ = execute(kc, "1")
        assert reply["execution_count"] == 1  # a fresh kernel counts from 1
        assert value_of(kc, "'before_restart' in globals()") == "False"
        assert value_of(kc, "6*7") == "42"
        assert wait_until(lambda: not process_alive(old_engine), GONE_WITHIN)
        assert not process_alive(old_kernel)
        assert engine_pid_of(km) != old_engine


def test_killed_kernel_takes_its_engine_along() -> None:
    with kernel("zeroboot") as (km, kc):
        assert value_of(kc, "1") == "1"
        kpid, epid = kernel_pid(km), engine_pid_of(km)
        os.kill(kpid, signal.SIGKILL)
        assert wait_until(lambda: not process_alive(epid), GONE_WITHIN), "engine survived its kernel (PDEATHSIG)"


def test_engine_death_while_idle_stops_the_kernel() -> None:
    with kernel("zeroboot") as (km, kc):
        assert value_of(kc, "1") == "1"
        os.kill(engine_pid_of(km), signal.SIGKILL)
        assert wait_until(lambda: not km.is_alive(), 15), "the kernel kept running without its engine"
        assert km.provisioner.process.returncode not in (0, None)  # type: ignore[union-attr]


def test_engine_death_during_a_cell_replies_then_stops() -> None:
    with kernel("zeroboot") as (km, kc):
        # a first cell: the engine has finished starting (a kill while it starts is retried by design)
        assert execute(kc, "1")[0]["status"] == "ok"
        epid = engine_pid_of(km)
        msg_id = kc.execute("while True: pass")
        time.sleep(0.5)
        os.kill(epid, signal.SIGKILL)
        reply = shell_reply(kc, msg_id, timeout=30)["content"]
        msgs = collect(kc, msg_id, timeout=30)
        assert reply["status"] == "error" and reply["ename"] == "EngineDied", reply
        assert "restart" in reply["evalue"]
        assert any(m["msg_type"] == "error" for m in msgs)
        assert wait_until(lambda: not km.is_alive(), 15), "the kernel kept running without its engine"


def test_an_engine_that_cannot_start_is_said_at_the_first_cell() -> None:
    # The engine refuses /tmp as the notebook's folder at once, so the one started before the
    # kernel's imports (kernel_launch.py) has ended by the time the kernel takes it over.
    km = manager("zeroboot")
    km.start_kernel(cwd="/tmp", stderr=subprocess.PIPE)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=TIMEOUT)
        reply, msgs = execute(kc, "1")
        assert reply["status"] == "error" and "private /tmp" in reply["evalue"], reply
        assert any(m["msg_type"] == "error" for m in msgs)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        km.cleanup_resources()


def test_bad_configuration_fails_loudly() -> None:
    km = manager("zeroboot", ZEROBOOT_MODE="sideways")
    km.start_kernel(stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: not km.is_alive(), 30), "a misconfigured kernel kept running"
        err = km.provisioner.process.stderr.read().decode()  # type: ignore[union-attr]
        assert "ZEROBOOT_MODE='sideways'" in err and "chained or isolated" in err, err[-2000:]
    finally:
        km.cleanup_resources()


def test_environment_configures_the_kernel() -> None:
    with kernel("zeroboot", ZEROBOOT_CELL_TIMEOUT="1.5", ZEROBOOT_CHECKPOINTS="2",
                ZEROBOOT_MODE="isolated") as (km, kc):
        reply, msgs = execute(kc, "%sandbox timeout")
        assert "1.5 s" in "".join(m["content"].get("text", "") for m in msgs)
        assert "isolated" in "".join(m["content"].get("text", "") for m in execute(kc, "%sandbox mode")[1])
        execute(kc, "%sandbox mode chained")
        for i in range(4):
            execute(kc, f"kept_{i} = {i}")
        reply, _ = execute(kc, "%rewind 3")
        assert reply["status"] == "error" and "2 checkpoint" in reply["evalue"], reply
        reply, _ = execute(kc, "while True: pass", timeout=30)
        assert reply["ename"] == "SandboxTimeout"


def test_template_build_progress_goes_to_the_kernel_log(tmp_path: Path) -> None:
    km = manager("zeroboot", ZEROBOOT_TEMPLATE="kt_progress")  # a template nobody built yet
    with open(tmp_path / "kernel.log", "wb") as log_file:
        km.start_kernel(stderr=log_file)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=TIMEOUT)
        assert value_of(kc, "6*7") == "42"
        stats = "".join(m["content"].get("text", "") for m in execute(kc, "%sandbox stats")[1])
        assert "kt_progress" in stats
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    log = (tmp_path / "kernel.log").read_text()
    assert "zeroboot: template 'kt_progress': booting Python" in log, log[-3000:]
    assert "zeroboot: template 'kt_progress': built in" in log, log[-3000:]
