"""Interrupts at any moment and in any number never break the session (issue 22).

A property-style test: seeded random schedules, each a cell of some kind (sleeping, printing,
printing a lot, computing in C, stuck in C, waiting for input(), ending at once, completion,
%rewind) with 1-30 interrupts at random moments (before the cell starts, right after the request,
while it runs, right after it ends), sent as the frontend does (SIGINT through
KernelManager.interrupt_kernel, the kernelspecs' interrupt_mode) or as interrupt_request messages,
sometimes with a kernel restart mixed in. After each schedule the next 3 cells must print exactly
what they should, and `%sandbox stats` must count exactly the rollbacks the replies reported.

Many schedules share one kernel (a restart only when the schedule asks for one), so 100 schedules
per kernelspec fit CI's budget. ZEROBOOT_INTERRUPT_SCHEDULES=N runs N per kernelspec instead;
ZEROBOOT_INTERRUPT_SEED=S replays a failing run (the failure message names seed and schedule).
"""
from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from queue import Empty
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from kernel_helpers import TIMEOUT, collect, execute, kernel, plain, shell_reply, stream_text

SCHEDULES = int(os.environ.get("ZEROBOOT_INTERRUPT_SCHEDULES", "100"))
SEED = int(os.environ.get("ZEROBOOT_INTERRUPT_SEED", "22"))
RESTART_RATE = float(os.environ.get("ZEROBOOT_INTERRUPT_RESTART_RATE", "0.02"))
ROLLBACK_ENAMES = ("SandboxTimeout", "SandboxCrashed", "SandboxError", "SandboxMemoryError", "ChannelError")

# name -> (code, expected stdout if it runs to the end, whether it can stop only by a rollback)
CELLS: dict[str, tuple[str, str | None, bool]] = {
    "sleep": ("import time\nfor i in range(30): time.sleep(0.01)", "", False),
    "print": ("import time\nfor i in range(30):\n    print(i)\n    time.sleep(0.005)",
              "".join(f"{i}\n" for i in range(30)), False),
    "large_output": ("for i in range(60): print(str(i % 10) * 5000)",
                     "".join(str(i % 10) * 5000 + "\n" for i in range(60)), False),
    "compute_c": ("import numpy\nfor i in range(3): numpy.sort(numpy.random.rand(300_000))", "", False),
    "quick": ("quick_value = 6 * 7", "", False),
    "input": ("answer = input('? ')\nprint('got', answer)", "got typed\n", False),
    # a C call that never checks for signals, in a loop that swallows KeyboardInterrupt: only
    # the rollback after the grace period ends it (each interrupt schedule of it has one)
    # a crash: the rollback runs while interrupts keep coming (or one stops it before the crash)
    "crash": ("import time\ntime.sleep(0.05)\nimport ctypes\nctypes.string_at(0)", None, False),
    "stuck_c": ("for i in range(3):\n    try:\n        sum(range(10**13))\n    except KeyboardInterrupt:\n"
                "        pass", None, True),
}
SIDE_REQUESTS = ("complete", "inspect", "rewind")


@dataclass
class Schedule:
    number: int
    kind: str
    delays: list[float]          # seconds after the request (negative: before it)
    by_signal: list[bool]        # per interrupt: SIGINT (interrupt_kernel) or interrupt_request
    restart_at: float | None     # a kernel restart at this many seconds after the request
    answer_after: float = 0.0    # input(): how long the "user" takes to answer

    def describe(self, seed: int) -> str:
        return (f"seed {seed} schedule {self.number}: {self.kind}, {len(self.delays)} interrupt(s) at "
                f"{[round(d, 3) for d in self.delays]}, restart at {self.restart_at}")


def make_schedule(rng: random.Random, number: int) -> Schedule:
    kind = rng.choice(list(CELLS) + list(SIDE_REQUESTS))
    n = rng.randint(1, 30)
    moment = rng.choice(["before", "start", "running", "after", "mixed"])
    horizon = 0.4
    delays: list[float] = []
    for _ in range(n):
        m = rng.choice(["before", "start", "running", "after"]) if moment == "mixed" else moment
        delays.append({"before": -rng.uniform(0, 0.05), "start": 0.0, "running": rng.uniform(0, horizon),
                       "after": horizon + rng.uniform(0, 0.2)}[m])
    if kind == "stuck_c":  # it must be interrupted while it runs, or it would run for ever
        delays.append(rng.uniform(0.05, 0.4))
    delays.sort()
    restart_at = rng.uniform(0, 0.5) if rng.random() < RESTART_RATE else None
    return Schedule(number, kind, delays, [rng.random() < 0.5 for _ in delays], restart_at,
                    answer_after=rng.uniform(0, 0.3))


@dataclass
class Session:
    km: KernelManager
    kc: BlockingKernelClient
    mode: str
    rollbacks: int = 0               # rollbacks the replies reported since the kernel started
    log: list[str] = field(default_factory=list)


def _interrupt_request(kc: BlockingKernelClient) -> None:
    # through the client's own session: its msg_ids never repeat those of execute requests
    kc.control_channel.send(kc.session.msg("interrupt_request", {}))


def _fire(s: Session, sched: Schedule, t0: float, stop: threading.Event) -> None:
    for delay, by_signal in zip(sched.delays, sched.by_signal):
        wait = t0 + max(delay, 0.0) - time.monotonic()
        if wait > 0 and stop.wait(wait):
            return
        if by_signal:
            s.km.interrupt_kernel()
        else:
            _interrupt_request(s.kc)


def _drain(kc: BlockingKernelClient) -> None:
    for get in (kc.get_iopub_msg, kc.get_shell_msg, kc.get_stdin_msg, kc.control_channel.get_msg):
        while True:
            try:
                get(timeout=0.01)
            except Empty:
                break


def _run_cell(s: Session, code: str, answer_after: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute, answering input() requests, until the reply and the idle status; returns the reply
    and the request's IOPub messages."""
    msg_id = s.kc.execute(code, allow_stdin=True)
    reply: dict[str, Any] | None = None
    msgs: list[dict[str, Any]] = []
    idle = False
    deadline = time.monotonic() + TIMEOUT
    while reply is None or not idle:
        assert time.monotonic() < deadline, f"no reply/idle within {TIMEOUT} s; got {[m['msg_type'] for m in msgs]}"
        try:
            req = s.kc.get_stdin_msg(timeout=0.005)
            if req["parent_header"].get("msg_id") == msg_id:
                time.sleep(answer_after)
                s.kc.input("typed")
        except Empty:
            pass
        try:
            msg = s.kc.get_shell_msg(timeout=0.005)
            if msg["parent_header"].get("msg_id") == msg_id:
                reply = msg["content"]
        except Empty:
            pass
        while True:
            try:
                msg = s.kc.get_iopub_msg(timeout=0.005)
            except Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                idle = idle or msg["content"]["execution_state"] == "idle"
            elif msg["msg_type"] != "execute_input":
                msgs.append(msg)
    return reply, msgs


def _check_cell(s: Session, sched: Schedule, reply: dict[str, Any], msgs: list[dict[str, Any]], where: str) -> None:
    _, full, stuck = CELLS[sched.kind]
    errors = [m for m in msgs if m["msg_type"] == "error"]
    assert len(errors) <= 1, f"{where}: more than one error for one cell: {[e['content']['ename'] for e in errors]}"
    out = stream_text(msgs)
    if reply["status"] == "ok":
        assert not stuck and sched.kind != "crash", f"{where}: a stuck or crashing cell ended ok"
        assert out == full, f"{where}: the cell ran to its end but printed {out[:200]!r}"
        return
    ename = reply.get("ename")
    if sched.kind == "crash" and ename == "SandboxCrashed":
        s.rollbacks += 1
        assert "rolled back" in reply.get("evalue", "") or "clean sandbox" in reply.get("evalue", ""), reply
        return
    if ename in ROLLBACK_ENAMES:
        s.rollbacks += 1
        assert "interrupt" in reply.get("evalue", ""), f"{where}: rollback for another reason: {reply}"
        # a cell whose code stops at a KeyboardInterrupt is rolled back only if the interrupt
        # was lost on its way (dropped while the cell was being set up, or never delivered)
        assert stuck, f"{where}: rolled back instead of interrupted: {reply.get('evalue')}"
    else:
        # (a cell stuck in C ends so only when the interrupt came before its code started)
        assert ename == "KeyboardInterrupt", f"{where}: {ename}: {plain(reply.get('evalue', ''))[:300]}"
    # whatever it printed before the interrupt arrived, complete lines, in order, nothing lost
    if full is not None:
        assert full.startswith(out) or full.startswith(out.rsplit("\n", 1)[0]), \
            f"{where}: output is not a prefix of the cell's output: {out[-200:]!r}; stderr " \
            f"{stream_text(msgs, 'stderr')[-3000:]!r}"


def _side_request(s: Session, sched: Schedule) -> None:
    if sched.kind == "complete":
        msg_id = s.kc.complete("pri", 3)
    elif sched.kind == "inspect":
        msg_id = s.kc.inspect("print", 5)
    else:
        msg_id = s.kc.execute("%rewind")
    deadline = time.monotonic() + TIMEOUT
    while True:
        msg = s.kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            break
    content = msg["content"]
    if sched.kind == "complete":
        assert content["status"] == "ok" and "print" in content["matches"], content
    elif sched.kind == "inspect":
        assert content["status"] == "ok" and content["found"], content
    else:  # the previous cell undone, or a clear error (isolated mode, no checkpoint after a restart)
        assert content["status"] == "ok" or re.search("isolated|checkpoint", content.get("evalue", "")), content


def _restart(s: Session) -> None:
    s.km.restart_kernel(now=False)
    s.kc.wait_for_ready(timeout=TIMEOUT)
    s.rollbacks = 0
    _drain(s.kc)


def _barrier(s: Session) -> None:
    """Everything sent so far is handled: interrupt_requests answered, SIGINTs processed (the
    kernel handles a signal on its main loop before the kernel_info request that follows it)."""
    s.kc.kernel_info()
    deadline = time.monotonic() + TIMEOUT
    while True:
        msg = s.kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["msg_type"] == "kernel_info_reply":
            break
    _drain(s.kc)


def _stats_rollbacks(s: Session) -> int:
    reply, msgs = execute(s.kc, "%sandbox stats")
    assert reply["status"] == "ok", reply
    found = re.search(r"rollbacks \(crash/timeout/interrupt\)\s+(\d+)", stream_text(msgs))
    assert found, stream_text(msgs)
    return int(found.group(1))


def run_schedule(s: Session, sched: Schedule, seed: int) -> None:
    where = sched.describe(seed)
    started = time.monotonic()
    stop = threading.Event()
    t0 = time.monotonic() - min(min(sched.delays), 0.0)  # negative delays: fire before the request
    firing = threading.Thread(target=_fire, args=(s, sched, t0, stop), daemon=True)
    firing.start()
    time.sleep(max(0.0, t0 - time.monotonic()))
    try:
        if sched.restart_at is not None:
            # a restart while the cell runs and interrupts come in; the cell's reply may never come
            # (its kernel went away): what counts is the session after it. Interrupts stop before
            # the restart (one reaching a kernel process that has not yet set up its SIGINT
            # handling would end it, as it would end ipykernel).
            s.kc.execute(CELLS.get(sched.kind, CELLS["sleep"])[0], allow_stdin=False)
            time.sleep(sched.restart_at)
            stop.set()
            firing.join()
            _restart(s)
        elif sched.kind in SIDE_REQUESTS:
            _side_request(s, sched)
        else:
            reply, msgs = _run_cell(s, CELLS[sched.kind][0], sched.answer_after)
            _check_cell(s, sched, reply, msgs, where)
    finally:
        firing.join()
    _barrier(s)
    for k in range(3):
        text = f"alive-{sched.number}-{k}"
        reply, msgs = execute(s.kc, f"print({text!r})")
        assert reply["status"] == "ok", f"{where}: cell {k} after it: {reply}"
        assert stream_text(msgs) == text + "\n", f"{where}: cell {k} after it printed {stream_text(msgs)!r}"
        assert [m["msg_type"] for m in msgs] == ["stream"], f"{where}: {[m['msg_type'] for m in msgs]}"
    assert _stats_rollbacks(s) == s.rollbacks, f"{where}: %sandbox stats counts another number of rollbacks"
    s.log.append(f"{where}: {time.monotonic() - started:.2f} s")


@pytest.fixture(scope="module", params=["zeroboot", "zeroboot-isolated"])
def session(request: pytest.FixtureRequest) -> Iterator[Session]:
    with kernel(request.param) as (km, kc):
        execute(kc, "import time, numpy")
        yield Session(km, kc, request.param)


def test_random_interrupt_schedules(session: Session) -> None:
    seed = SEED + (1 if session.mode.endswith("isolated") else 0)
    rng = random.Random(seed)
    for number in range(SCHEDULES):
        run_schedule(session, make_schedule(rng, number), seed)
    print("\n".join(session.log))


@pytest.mark.parametrize("name", ["zeroboot", "zeroboot-isolated"])
def test_interrupts_from_a_clone_of_the_client_session(name: str) -> None:
    """The issue's exact report, in a fresh kernel: 5 interrupts 50 ms apart from
    KernelManager.interrupt_kernel, whose Session is a clone of the client's (in interrupt_mode
    message its msg_ids are those of the client's next requests, and the interrupt's idle status
    ends their output early for a client that collects by parent msg_id), then the next cells
    print."""
    with kernel(name) as (km, kc):
        msg_id = kc.execute("import time\nfor i in range(100): time.sleep(0.05)")
        time.sleep(0.3)
        for _ in range(5):
            km.interrupt_kernel()
            time.sleep(0.05)
        reply, msgs = _collect(kc, msg_id)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        for k in range(3):
            reply, msgs = _collect(kc, kc.execute(f"print('alive-{k}')"))
            assert reply["status"] == "ok" and stream_text(msgs) == f"alive-{k}\n", (reply, msgs)


def _collect(kc: BlockingKernelClient, msg_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """kernel_helpers.execute's way: IOPub of msg_id up to its idle status, then the reply."""
    msgs = collect(kc, msg_id)
    return shell_reply(kc, msg_id)["content"], [m for m in msgs if m["msg_type"] not in ("status", "execute_input")]
