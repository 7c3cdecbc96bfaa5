"""Threads in notebook cells (issue 14): threading, ThreadPoolExecutor, Timer, queue workers and
tqdm's monitor thread work; output of a background thread goes to the running cell; a crash in a
thread rolls the cell back; an interrupt reaches the main thread with threads alive; a timeout
stops every thread; %rewind, isolated mode and Sandbox.fork carry (or clear) the threads; threads
keep running between cells (Session.between_cells, as the engine server runs it) until a request
comes or they all wait, and the checkpoint before the next cell is the state at its start."""
from __future__ import annotations

import socket
import threading

import pytest

from session_helpers import RequestArrival, Safety, between_cells_until_idle, cell, ok
from zeroboot_kernel import engine_requests as req
from zeroboot_kernel import engine_wire as wire
from zeroboot_kernel import schema
from zeroboot_kernel.engine_server import EngineServer
from zeroboot_kernel.session import Session


def test_thread_start_join_pool_timer_and_queue(s: Session) -> None:
    out = ok(cell(s, "import threading, queue\n"
                     "from concurrent.futures import ThreadPoolExecutor\n"
                     "r = []\n"
                     "t = threading.Thread(target=lambda: r.append(threading.get_native_id()))\n"
                     "t.start(); t.join()\n"
                     "print(len(r), r[0] != threading.get_native_id() or 'same tid')\n"
                     "with ThreadPoolExecutor(4) as ex:\n"
                     "    print(sum(ex.map(lambda x: x * x, range(1000))))\n"
                     "ev = threading.Event()\n"
                     "threading.Timer(0.05, ev.set).start()\n"
                     "print(ev.wait(10))\n"
                     "q, got = queue.Queue(), []\n"
                     "def worker():\n"
                     "    while (x := q.get()) is not None:\n"
                     "        got.append(x * 2)\n"
                     "w = threading.Thread(target=worker); w.start()\n"
                     "for i in range(5): q.put(i)\n"
                     "q.put(None); w.join()\n"
                     "print(got, threading.active_count())", 1))
    assert out == "1 True\n332833500\nTrue\n[0, 2, 4, 6, 8] 1\n", out


def test_tqdm_starts_its_monitor_without_a_warning(s: Session) -> None:
    out = ok(cell(s, "import warnings\nwarnings.simplefilter('error')\n"
                     "from tqdm import tqdm\n"
                     "for _ in tqdm(range(3)): pass\n"
                     "print('monitor', tqdm.monitor is not None and tqdm.monitor.is_alive())", 1))
    assert "monitor True" in out and "TqdmMonitorWarning" not in out, out


def test_background_thread_output_goes_to_the_running_cell(s: Session) -> None:
    ok(cell(s, "import threading, time\n"
               "go = threading.Event()\n"
               "def later():\n"
               "    go.wait()\n"
               "    print('from the thread')\n"
               "t = threading.Thread(target=later); t.start()", 1))
    out = ok(cell(s, "go.set(); t.join(); print('main')", 2))
    assert out == "from the thread\nmain\n", out


def test_background_thread_runs_while_later_cells_run(s: Session) -> None:
    ok(cell(s, "import threading, time\n"
               "ticks, stop = [], threading.Event()\n"
               "def tick():\n"
               "    while not stop.is_set():\n"
               "        ticks.append(1); time.sleep(0.01)\n"
               "threading.Thread(target=tick, daemon=True).start()", 1))
    out = ok(cell(s, "n = len(ticks); time.sleep(0.3); print(len(ticks) > n + 5)", 2))
    assert out == "True\n", out
    ok(cell(s, "stop.set()", 3))


def test_crash_in_a_thread_rolls_the_cell_back(s: Session) -> None:
    ok(cell(s, "import threading, ctypes, time\nx = 1", 1))
    r = cell(s, "x = 2\nthreading.Thread(target=ctypes.string_at, args=(0,)).start()\ntime.sleep(5)", 2)
    assert r["status"] == "error" and r["ename"] == "SandboxCrashed", r
    assert ok(cell(s, "print(x, threading.active_count())", 3)) == "1 1\n"


def test_interrupt_with_threads_alive_raises_in_the_main_thread(s: Session) -> None:
    ok(cell(s, "import threading, time\n"
               "stop = threading.Event()\n"
               "def spin():\n"
               "    while not stop.is_set(): pass\n"
               "th = threading.Thread(target=spin); th.start()", 1))
    # several times: the interrupt lands at a different point of the spinner each time (the spinner's
    # registers were once parked stale when the interrupt's run switched to the main thread)
    for attempt in range(3):
        threading.Timer(0.5, s.sandbox.interrupt).start()
        r = cell(s, "time.sleep(30)", 2 + attempt)
        assert r["status"] == "error" and r["ename"] == "KeyboardInterrupt", (attempt, r)
    assert ok(cell(s, "stop.set(); th.join(); print('joined')", 5)) == "joined\n"


def test_timeout_stops_every_thread(template) -> None:
    s = Session(template, timeout=1.0)
    try:
        ok(cell(s, "import threading", 1))
        r = cell(s, "t = threading.Thread(target=lambda: [0 for _ in iter(int, 1)]); t.start(); t.join()", 2)
        assert r["status"] == "error" and r["ename"] == "SandboxTimeout", r
        assert ok(cell(s, "print(threading.active_count(), 't' in globals())", 3)) == "1 False\n"
    finally:
        s.close()


def test_rewind_restores_threads(s: Session) -> None:
    ok(cell(s, "import threading\ngo = threading.Event()\nt = threading.Thread(target=go.wait); t.start()", 1))
    ok(cell(s, "go.set(); t.join(); print(t.is_alive())", 2))
    s.rewind(1)  # the state before cell 2: the thread waits again
    assert ok(cell(s, "print(t.is_alive()); go.set(); t.join(); print(t.is_alive())", 3)) == "True\nFalse\n"


def test_isolated_cells_start_with_no_user_threads(template) -> None:
    s = Session(template, mode="isolated")
    try:
        ok(cell(s, "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
                   "print(threading.active_count())", 1))
        assert ok(cell(s, "import threading\nprint(threading.active_count())", 2)) == "1\n"
    finally:
        s.close()


def test_sandbox_fork_carries_threads(template) -> None:
    with template.fork() as sb:
        r = sb.execute("import threading\ngo = threading.Event()\nres = []\n"
                       "t = threading.Thread(target=lambda: (go.wait(), res.append('ran'))); t.start()")
        assert r.status == "ok", r
        with sb.fork() as child:
            r = child.execute("go.set(); t.join(); print(res)")
            assert r.status == "ok" and r.stdout == "['ran']\n", r
        r = sb.execute("print(t.is_alive(), res)")
        assert r.stdout == "True []\n", r  # the parent's thread still waits


def test_threads_run_between_cells_until_they_all_wait(s: Session) -> None:
    """No request comes: the run ends by itself once the thread waits without a timeout, and the
    checkpoint before the next cell is the state then (not the state at the reply)."""
    ok(cell(s, "import threading, time\nsteps, go = [], threading.Event()\n"
               "def work():\n"
               "    for i in range(20):\n"
               "        time.sleep(0.005); steps.append(i)\n"
               "    go.wait()\n"
               "threading.Thread(target=work, daemon=True).start()", 1))
    between_cells_until_idle(s, "the run between cells did not end when every thread waited")
    assert s.ready is not None  # retaken once the thread waited
    assert ok(cell(s, "print(len(steps))", 2)) == "20\n"
    s.rewind(1)  # the state before cell 2: the thread's 20 steps, taken between the cells
    assert ok(cell(s, "print(len(steps), threading.active_count())", 3)) == "20 2\n"


def test_a_request_stops_threads_running_between_cells(s: Session) -> None:
    ok(cell(s, "import threading, time\nticks, stop = [], threading.Event()\n"
               "def tick():\n"
               "    while not stop.is_set():\n"
               "        ticks.append(1); time.sleep(0.01)\n"
               "threading.Thread(target=tick, daemon=True).start()\n"
               "n = len(ticks)", 1))
    request = RequestArrival(s)
    request.after(0.5)
    s.between_cells(request.arrived.is_set)
    assert s.ready is None  # the thread ran: the state at the reply is stale, the next cell takes its own
    assert ok(cell(s, "print(len(ticks) > n + 5)", 2)) == "True\n"  # ~50 ticks of the 0.5 s between cells
    s.rewind(1)  # before cell 2 = at its start, after the ticks between the cells
    assert ok(cell(s, "print(len(ticks) > n + 5); stop.set()", 3)) == "True\n"


def test_idle_threads_do_not_run_between_cells(s: Session) -> None:
    """Threads that all wait without a timeout: nothing can change before a request, so the run
    ends at once (no CPU spent) and the checkpoint prepared at the reply stands."""
    ok(cell(s, "import threading\nev = threading.Event()\n"
               "for _ in range(4): threading.Thread(target=ev.wait, daemon=True).start()", 1))
    s.prepare_next_cell()  # as the engine server does after every reply
    prepared = s.ready
    between_cells_until_idle(s)
    assert prepared is not None and s.ready is prepared


def test_a_crash_in_a_thread_between_cells_rolls_the_last_cell_back(s: Session) -> None:
    ok(cell(s, "import threading, time, ctypes\nx = 1", 1))
    ok(cell(s, "x = 2\nthreading.Thread(target=lambda: (time.sleep(0.5), ctypes.string_at(0)), daemon=True).start()", 2))
    between_cells_until_idle(s)
    out = ok(cell(s, "print(x, threading.active_count())", 3))
    assert "crashed the sandbox after the last cell ended" in out and "before cell [2]" in out, out
    assert out.endswith("1 1\n"), out


def test_engine_server_socket_stops_the_run_between_cells(s: Session) -> None:
    """The engine server's own path: a message arriving on its socket kicks the run (O_ASYNC)."""
    ok(cell(s, "import threading, time\nstop = threading.Event()\n"
               "threading.Thread(target=lambda: [time.sleep(0.01) for _ in iter(stop.is_set, True)], "
               "daemon=True).start()", 1))
    mine, kernel_side = socket.socketpair()
    with mine, kernel_side, Safety(s) as safety:
        server = EngineServer(mine, s)
        threading.Timer(0.3, wire.send, args=(kernel_side, {"op": req.STATS, "id": 1})).start()
        server.between_requests()
        assert not safety.fired, "the request did not stop the run"
        assert server.request_waiting()
    assert ok(cell(s, "stop.set(); print('ok')", 2)) == "ok\n"


def test_output_of_threads_between_cells_reaches_idle_stream_as_it_comes(s: Session) -> None:
    """While threads run between cells, each line they print reaches Sandbox.idle_stream before
    the next cell starts (the engine server publishes it live); the checkpoint guarantee holds
    (the thread ran, so the state at the reply is not kept)."""
    got: list[tuple[str, str]] = []
    s.sandbox.idle_stream = lambda name, text: got.append((name, text))
    ok(cell(s, "import threading, time, sys\ndone = threading.Event()\n"
               "def talk():\n"
               "    for i in range(3):\n"
               "        time.sleep(0.02); print('tick', i)\n"
               "    print('to stderr', file=sys.stderr)\n"
               "    done.wait()\n"
               "threading.Thread(target=talk, daemon=True).start()", 1))
    between_cells_until_idle(s, "the run between cells did not end when the thread waited")
    assert "".join(t for n, t in got if n == "stdout").endswith("tick 0\ntick 1\ntick 2\n"), got
    assert ("stderr", "to stderr\n") in got, got
    assert ok(cell(s, "print('next'); done.set()", 2)) == "next\n"  # nothing held back for this cell


def test_output_of_threads_between_cells_is_held_without_idle_stream(s: Session) -> None:
    """Without an idle_stream (a batch run, not the kernel), what threads print between cells
    goes out first with the next cell's output, as before."""
    assert s.sandbox.idle_stream is None
    ok(cell(s, "import threading, time\ndone = threading.Event()\n"
               "def talk():\n"
               "    time.sleep(0.02); print('from the thread')\n"
               "    done.wait()\n"
               "threading.Thread(target=talk, daemon=True).start()", 1))
    between_cells_until_idle(s)
    assert ok(cell(s, "print('next'); done.set()", 2)) == "from the thread\nnext\n"


def test_engine_server_sends_thread_output_on_its_idle_channel(s: Session) -> None:
    """The engine server's path: output between cells goes to the kernel on the idle channel as
    an idle_stream event (EngineClient's reader publishes it), not on the request channel."""
    ok(cell(s, "import threading, time\ndone = threading.Event()\n"
               "def talk():\n"
               "    time.sleep(0.02); print('live')\n"
               "    done.wait()\n"
               "threading.Thread(target=talk, daemon=True).start()", 1))
    mine, kernel_side = socket.socketpair()
    idle_mine, idle_kernel = socket.socketpair()
    with mine, kernel_side, idle_mine, idle_kernel, Safety(s) as safety:
        server = EngineServer(mine, s, idle_mine)
        s.sandbox.idle_stream = server.idle_output
        server.between_requests()
        assert not safety.fired
        idle_kernel.settimeout(30)
        assert wire.recv(idle_kernel) == {"event": schema.IDLE_STREAM, "name": "stdout", "text": "live\n"}
        assert not server.request_waiting()  # nothing on the request channel
    s.sandbox.idle_stream = None
    assert ok(cell(s, "done.set(); print('ok')", 2)) == "ok\n"


WIDGET_THREAD = ("import threading, time, ipywidgets as w\ndone = threading.Event()\np = w.IntProgress(max=3)\n"
                 "def move():\n"
                 "    time.sleep(0.02); p.value = 3\n"
                 "    done.wait()\n"
                 "threading.Thread(target=move, daemon=True).start()")


def _comm_updates(messages: list[dict]) -> list[dict]:
    return [m["data"].get("state") for m in messages if m.get("kind") == "comm_msg"]


def test_engine_server_sends_comm_messages_between_cells_on_its_idle_channel(s: Session) -> None:
    """A widget a thread updates between cells: the comm message goes to the kernel on the idle
    channel as an idle_comm event (before, the engine took it for a broken channel and rolled the
    last cell back)."""
    ok(cell(s, WIDGET_THREAD, 1))
    mine, kernel_side = socket.socketpair()
    idle_mine, idle_kernel = socket.socketpair()
    with mine, kernel_side, idle_mine, idle_kernel, Safety(s) as safety:
        server = EngineServer(mine, s, idle_mine)
        s.sandbox.idle_comm = server.idle_comm
        server.between_requests()
        assert not safety.fired
        idle_kernel.settimeout(30)
        ev = wire.recv(idle_kernel)
        assert ev["event"] == schema.IDLE_COMM, ev
        checked = schema.comm_event(ev)
        assert checked["content"]["kind"] == "comm_msg" and checked["content"]["data"]["state"] == {"value": 3}, ev
        assert not server.request_waiting()  # nothing on the request channel
    s.sandbox.idle_comm = None
    assert ok(cell(s, "done.set(); print(p.value)", 2)) == "3\n"


def test_comm_messages_between_cells_are_held_without_idle_comm(s: Session) -> None:
    """Without an idle_comm (a batch run), a widget update a thread makes between cells goes out
    first with the next cell's messages (nbclient keeps widget state from them)."""
    assert s.sandbox.idle_comm is None
    ok(cell(s, WIDGET_THREAD, 1))
    between_cells_until_idle(s)
    comms: list[dict] = []
    s.execute("done.set()", execution_count=2, on_message=lambda mt, c: comms.append(c) if mt == "comm" else None)
    assert _comm_updates(comms) == [{"value": 3}], comms


def test_robust_mutex_of_an_exited_thread_reports_owner_died(template) -> None:
    """The engine walks an exiting thread's robust list (FUTEX_OWNER_DIED), as Linux does: the
    next lock of a robust mutex its owner left locked returns EOWNERDEAD instead of waiting
    forever (which the cell timeout would end)."""
    s = Session(template, timeout=30.0)
    try:
        out = ok(cell(s, "import ctypes, errno, threading\n"
                         "libc = ctypes.CDLL(None)\n"
                         "attr, m = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)\n"
                         "libc.pthread_mutexattr_init(attr); libc.pthread_mutexattr_setrobust(attr, 1)\n"
                         "libc.pthread_mutex_init(m, attr)\n"
                         "t = threading.Thread(target=libc.pthread_mutex_lock, args=(m,)); t.start(); t.join()\n"
                         "r = libc.pthread_mutex_lock(m)\n"
                         "print(r == errno.EOWNERDEAD, libc.pthread_mutex_consistent(m), libc.pthread_mutex_unlock(m))", 1))
        assert out == "True 0 0\n", out
    finally:
        s.close()


def test_threads_that_fork_at_once_get_their_own_wait_results(s: Session) -> None:
    """Threads that each fork and wait for their child (CPython's test_reinit_tls_after_fork):
    the family's processes take turns, so a waiting thread's run can end on a yield to another
    process; a wake-up then writes the waiter's result into its slot, and the thread must be
    loaded from there (run_threads.c zb_run_threads_start). Before, it ran on with its registers
    of the blocked call, and glibc aborted on the futex "result" (the syscall number)."""
    out = ok(cell(s, "import os, threading\n"
                     "codes = []\n"
                     "def fork_and_wait():\n"
                     "    pid = os.fork()\n"
                     "    if pid == 0:\n"
                     "        os._exit(50)\n"
                     "    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
                     "for _ in range(5):\n"
                     "    ts = [threading.Thread(target=fork_and_wait) for _ in range(8)]\n"
                     "    for t in ts: t.start()\n"
                     "    for t in ts: t.join()\n"
                     "print(len(codes), set(codes))", 1))
    assert out == "40 {50}\n", out


@pytest.mark.parametrize("forged", [{"idle": 99}, {"idle": 0, "seq": 0}, {"idle": "0"}])
def test_forged_output_between_cells_rolls_the_last_cell_back(s: Session, forged: dict) -> None:
    """User code can write frames on the channel itself: a STREAM frame between requests with a
    wrong `idle` number, with both numberings, or with a number that is not an int, is a broken
    channel, handled as a thread's crash between cells (the last cell rolled back, told)."""
    got: list[tuple[str, str]] = []
    s.sandbox.idle_stream = lambda name, text: got.append((name, text))
    ok(cell(s, "x = 1", 1))
    ok(cell(s, "import threading, time, sys, json\nx = 2\n"
               "from _zeroboot_agent.frame_protocol import FrameType, pack_header\n"
               "def forge():\n"
               "    ch = sys.stdout._channel\n"
               "    while ch._in_request:  # after the reply: between the cells\n"
               "        time.sleep(0.01)\n"
               f"    body = json.dumps({{'name': 'stdout', 'text': 'forged', **{forged!r}}}).encode()\n"
               "    with ch.lock:\n"
               "        ch._write_all(pack_header(FrameType.STREAM, len(body)) + body)\n"
               "threading.Thread(target=forge, daemon=True).start()", 2))
    between_cells_until_idle(s)
    out = ok(cell(s, "print(x)", 3))
    assert "the sandbox was rolled back to its state before cell [2]" in out and out.endswith("1\n"), out
    assert ("stdout", "forged") not in got


def test_a_checkpoint_taken_while_a_thread_spins_restores_to_a_working_sandbox(s: Session) -> None:
    """A request stops a thread spinning in Python anywhere in its code; the next cell's checkpoint
    is that state, and a rollback to it gives a sandbox that runs (the kick's registers are in it)."""
    ok(cell(s, "import threading, ctypes\nx = 1\nstop = threading.Event()\n"
               "def spin():\n"
               "    n = 0\n"
               "    while not stop.is_set(): n += 1\n"
               "threading.Thread(target=spin, daemon=True).start()", 1))
    for n in (2, 4):
        request = RequestArrival(s)
        request.after(0.3)
        s.between_cells(request.arrived.is_set)
        assert request.arrived.is_set() and s.ready is None
        r = cell(s, "ctypes.string_at(0)", n)
        assert r["status"] == "error" and r["ename"] == "SandboxCrashed", r
        ok(cell(s, "x", n + 1))
    assert ok(cell(s, "stop.set(); print(x)", 6)) == "1\n"
