"""The agent's asyncio loop (guest/_zeroboot_agent/agent_loop.py): cells run inside a running loop
as under ipykernel, and the tasks and timers a cell leaves run between cells (Session.between_cells,
as the engine server runs it) until a request comes or the loop has nothing to do by itself; the
checkpoint before the next cell is the state at its start; a crash in a task between cells rolls
the last cell back; a task that never waits does not stop the session. What a notebook sees of it
is compared with ipykernel in the differential battery (tests/compat_cells.py, `asyncio-*`)."""
from __future__ import annotations

import threading

import pytest

from kernel_helpers import collect, kernel
from session_helpers import RequestArrival, Safety, between_cells_until_idle, cell, ok
from test_threads_live_output import stdout_of, stream_until
from zeroboot_kernel.session import Session


def test_a_plain_cell_leaves_the_agent_in_its_blocking_read(s: Session) -> None:
    """Nothing scheduled: the agent waits for its request with the UART read that stops the run
    (no poll, nothing run between cells); a timer makes the wait a timed one."""
    ok(cell(s, "import asyncio\nx = 1", 1))
    assert not s.sandbox.waits_timed and not s.runs_between_cells()
    ok(cell(s, "h = asyncio.get_running_loop().call_later(3600, print, 'late')", 2))
    assert s.sandbox.waits_timed and s.runs_between_cells()
    ok(cell(s, "h.cancel()", 3))
    assert not s.sandbox.waits_timed


def test_tasks_run_between_cells_until_the_loop_waits(s: Session) -> None:
    """No request comes: the run ends by itself once every task waits for something only a
    request can bring, and the checkpoint before the next cell is the state then."""
    ok(cell(s, "import asyncio\nsteps = []\nidle = asyncio.Event()\n"
               "async def work():\n"
               "    for i in range(20):\n"
               "        await asyncio.sleep(0.005); steps.append(i)\n"
               "    await idle.wait()\n"
               "task = asyncio.ensure_future(work())", 1))
    between_cells_until_idle(s, "the run between cells did not end when the loop had nothing to do")
    assert s.ready is not None  # retaken once the loop waited without a timer
    assert ok(cell(s, "print(len(steps), task.done())", 2)) == "20 False\n"
    s.rewind(1)  # the state before cell 2: the task's 20 steps, taken between the cells
    assert ok(cell(s, "print(len(steps)); idle.set(); await task; print(task.done())", 3)) == "20\nTrue\n"


def test_a_request_stops_a_task_running_between_cells(s: Session) -> None:
    """The task prints each tick (idle output, as it comes); the request comes after its sixth
    tick between cells, whatever the host's load, and the run stops there."""
    request, seen = RequestArrival(s), []

    def on_idle(name: str, text: str) -> None:
        seen.append(text)
        if "".join(seen).count("tick") >= 6 and not request.arrived.is_set():
            request()

    ok(cell(s, "import asyncio\nticks = []\n"
               "async def tick():\n"
               "    while True:\n"
               "        await asyncio.sleep(0.01); ticks.append(1); print('tick')\n"
               "ticker = asyncio.ensure_future(tick())\nn = len(ticks)", 1))
    s.sandbox.idle_stream = on_idle
    with Safety(s) as safety:
        s.between_cells(request.arrived.is_set)
    assert not safety.fired and request.arrived.is_set()
    assert s.ready is None  # the task ran: the state at the reply is stale, the next cell takes its own
    s.sandbox.idle_stream = None
    assert ok(cell(s, "ticker.cancel()\nprint(len(ticks) >= n + 6)", 2)).endswith("True\n")


def test_a_task_that_never_waits_does_not_stop_the_session(s: Session) -> None:
    """A task looping on `await asyncio.sleep(0)` keeps the loop busy: the agent still waits for
    its requests (its first wait after a reply is a poll of the UART), cells run between the
    task's steps, as in ipykernel's loop, and the run between cells ends at a request."""
    ok(cell(s, "import asyncio\nspins = 0\nstop = False\n"
               "async def spin():\n"
               "    global spins\n"
               "    while not stop:\n"
               "        spins += 1; await asyncio.sleep(0)\n"
               "spinner = asyncio.ensure_future(spin())", 1))
    ok(cell(s, "before = spins", 2))
    request = RequestArrival(s)
    request.after(0.3)
    s.between_cells(request.arrived.is_set)
    assert request.arrived.is_set() and s.ready is None
    assert ok(cell(s, "print(spins > before, spinner.done())", 3)) == "True False\n"
    assert ok(cell(s, "stop = True\nawait spinner\nprint(spinner.done())", 4)) == "True\n"


def test_a_crash_in_a_task_between_cells_rolls_the_last_cell_back(s: Session) -> None:
    ok(cell(s, "import asyncio, ctypes\nx = 1", 1))
    ok(cell(s, "x = 2\nasync def crash():\n    await asyncio.sleep(0.2); ctypes.string_at(0)\n"
               "doomed = asyncio.ensure_future(crash())", 2))
    between_cells_until_idle(s)
    out = ok(cell(s, "print(x, 'doomed' in globals())", 3))
    assert "crashed the sandbox after the last cell ended" in out and "before cell [2]" in out, out
    assert out.endswith("1 False\n"), out


def test_a_host_interrupt_stops_an_awaiting_cell(s: Session) -> None:
    """The kernel's interrupt while a cell awaits: the cell ends (CancelledError when the
    interrupt lands in the loop's wait, as under ipykernel; KeyboardInterrupt if it lands in the
    cell's own code first), and the loop serves the next cell."""
    started = threading.Event()

    def on_stream(name: str, text: str) -> None:
        if "started" in text and not started.is_set():
            started.set()
            threading.Timer(0.2, s.sandbox.interrupt).start()

    ok(cell(s, "import asyncio", 1))
    r = s.execute("print('started')\nawait asyncio.sleep(60)", execution_count=2, on_stream=on_stream)
    assert r["status"] == "error" and r["ename"] in ("CancelledError", "KeyboardInterrupt"), r
    assert ok(cell(s, "await asyncio.sleep(0.01); print('next')", 3)) == "next\n"


@pytest.mark.parametrize("name", ["python3", "zeroboot"])
def test_a_task_prints_between_cells_live(name: str) -> None:
    """A task a cell started prints after the cell's reply, with no request: the lines reach the
    frontend as they come, under the cell's parent, in both kernels."""
    with kernel(name) as (_, kc):
        a = kc.execute("import asyncio\n"
                       "async def talk():\n"
                       "    await asyncio.sleep(0.3)\n"
                       "    for i in range(3):\n"
                       "        print('tick', i); await asyncio.sleep(0.05)\n"
                       "talker = asyncio.ensure_future(talk())")
        # (under load the task may print before the reply: those lines are cell A's output too)
        texts = stream_until(kc, "tick 2", stdout_of(collect(kc, a), {}))
        assert texts == {a: "tick 0\ntick 1\ntick 2\n"}, texts


def test_a_cell_that_stops_the_loop_leaves_the_session_serving(s: Session) -> None:
    """loop.stop() from a cell ends the loop's run_until_complete at its next wait: the agent says
    so on stderr and runs it again, and the next cells, tasks included, go on."""
    ok(cell(s, "import asyncio\nasyncio.get_running_loop().stop()\nx = 1", 1))
    out = ok(cell(s, "await asyncio.sleep(0.01); print(x)", 2))
    assert out.endswith("1\n") and "Event loop stopped" in out, out
    assert ok(cell(s, "await asyncio.sleep(0.01); print(x + 1)", 3)) == "2\n"


def test_a_thread_wakes_the_loop_between_cells(s: Session) -> None:
    """A thread that calls loop.call_soon_threadsafe after its cell ended: the agent waits on the
    loop's wake-up socket too, so the callback runs between cells (its print goes out as idle
    output), as in ipykernel's loop."""
    got: list[str] = []
    s.sandbox.idle_stream = lambda name, text: got.append(text)
    ok(cell(s, "import asyncio, threading, time\nloop = asyncio.get_running_loop()\ndone = threading.Event()\n"
               "def later():\n"
               "    time.sleep(0.2)\n"
               "    loop.call_soon_threadsafe(print, 'woken')\n"
               "    done.wait()\n"
               "threading.Thread(target=later, daemon=True).start()", 1))
    between_cells_until_idle(s, "the run between cells did not end when the thread waited")
    assert "".join(got) == "woken\n", got
    assert ok(cell(s, "done.set(); print('next')", 2)) == "next\n"


def test_a_checkpoint_taken_while_a_task_spins_restores_to_a_working_sandbox(s: Session) -> None:
    """A request stops a task that spins in Python (no syscall) anywhere in its code; the next cell's
    checkpoint is the state then. Rolling back to it (the cell crashes) must give a sandbox that
    runs: the registers the kick left in the vCPU are in the checkpoint, not those of the task's
    last syscall (restoring those crashed the next cell with SIGSEGV)."""
    ok(cell(s, "import asyncio, ctypes\nx = 1\nspins = 0\nstop = False\n"
               "async def spin():\n"
               "    global spins\n"
               "    while not stop:\n"
               "        spins += 1\n"
               "        if spins % 100_000 == 0: await asyncio.sleep(0)\n"
               "spinner = asyncio.ensure_future(spin())", 1))
    for n in (2, 4, 6):  # a few kicks, each landing somewhere else in the spin
        ok(cell(s, "x", n))  # (after a rollback the loop's work resumes with a request)
        assert s.runs_between_cells()
        request = RequestArrival(s)
        request.after(0.3)
        s.between_cells(request.arrived.is_set)
        assert request.arrived.is_set() and s.ready is None  # the spin ran until the request
        r = cell(s, "ctypes.string_at(0)", n + 1)  # its checkpoint, taken at its start, is the spin's state
        assert r["status"] == "error" and r["ename"] == "SandboxCrashed", r
    assert ok(cell(s, "stop = True\nawait spinner\nprint(x, spins > 0)", 8)) == "1 True\n"


def test_a_request_reaches_a_timed_wait_while_a_child_process_lives(template) -> None:
    """The loop waits for its request with a far timer (a timed UART poll, which yields) while a
    child process lives, so the family's scheduler runs the processes between cells. A request
    pushed then makes process 1 runnable at once: before, its waiting thread was seen as runnable
    only at its timer (here an hour), and the cell hung (a widget test caught it: loky's workers
    and a task waiting for a slider)."""
    s = Session(template, timeout=60)
    try:
        ok(cell(s, "import asyncio, subprocess\np = subprocess.Popen(['sleep', '600'])\n"
                   "h = asyncio.get_running_loop().call_later(3600, print, 'late')", 1))
        assert s.sandbox.waits_timed and s.sandbox.guest.process_count() == 2
        request = RequestArrival(s)
        request.after(0.3)
        s.between_cells(request.arrived.is_set)
        assert ok(cell(s, "print('served')", 2)) == "served\n"
        ok(cell(s, "h.cancel(); p.kill(); p.wait()", 3))
    finally:
        s.close()
