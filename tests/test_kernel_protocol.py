"""The kernel through jupyter_client: message ordering, rollback on crash/timeout/interrupt, stdin,
kernel magics, modes and stop_on_error. One kernel serves the whole module (state carried from
test to test is named per test, so the order does not matter)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from queue import Empty
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from kernel_helpers import (TIMEOUT, collect, execute, kernel, plain, result_text, shell_reply, stream_text,
                            value_of)

GRACE = 2.0  # the engine's interrupt grace period


@pytest.fixture(scope="module")
def zk() -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    with kernel("zeroboot") as (km, kc):
        yield km, kc


@pytest.fixture
def kc(zk: tuple[KernelManager, BlockingKernelClient]) -> BlockingKernelClient:
    client = zk[1]
    _drain(client)
    return client


def _drain(kc: BlockingKernelClient) -> None:
    for get in (kc.get_iopub_msg, kc.get_shell_msg, kc.get_stdin_msg):
        while True:
            try:
                get(timeout=0.05)
            except Empty:
                break


def _control(kc: BlockingKernelClient, msg_type: str, content: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = kc.session.msg(msg_type, content or {})
    kc.control_channel.send(msg)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        reply = kc.control_channel.get_msg(timeout=TIMEOUT)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            reply["_sent_id"] = msg["header"]["msg_id"]
            return reply
    raise TimeoutError(f"no {msg_type} reply")


def _assert_busy_idle(msgs: list[dict[str, Any]]) -> None:
    states = [m["content"]["execution_state"] for m in msgs if m["msg_type"] == "status"]
    assert msgs[0]["msg_type"] == "status" and msgs[0]["content"]["execution_state"] == "busy", msgs[0]
    assert msgs[-1]["msg_type"] == "status" and msgs[-1]["content"]["execution_state"] == "idle", msgs[-1]
    assert states == ["busy", "idle"], states


# ---- ordering ------------------------------------------------------------------------------

def test_busy_idle_around_every_shell_request(kc: BlockingKernelClient) -> None:
    requests = [
        lambda: kc.kernel_info(),
        lambda: kc.execute("print('x'); 1"),
        lambda: kc.complete("impo"),
        lambda: kc.inspect("print"),
        lambda: kc.is_complete("for i in x:"),
        lambda: kc.history(hist_access_type="tail", n=2),
        lambda: kc.comm_info(),
        lambda: kc.execute("%sandbox stats"),
    ]
    for send in requests:
        msg_id = send()
        reply = shell_reply(kc, msg_id)
        assert reply["content"]["status"] in ("ok", "incomplete"), reply["content"]  # is_complete's status
        _assert_busy_idle(collect(kc, msg_id))


def test_busy_idle_around_control_requests(kc: BlockingKernelClient) -> None:
    for msg_type in ("kernel_info_request", "interrupt_request"):
        reply = _control(kc, msg_type)
        assert reply["content"]["status"] == "ok", reply["content"]
        _assert_busy_idle(collect(kc, reply["_sent_id"]))
    assert _control(kc, "kernel_info_request")["content"]["implementation"] == "zeroboot"


def test_execute_message_order_and_idle_after_all_outputs(kc: BlockingKernelClient) -> None:
    code = ("import sys\nfrom IPython.display import HTML, display\nprint('out')\nprint('err', file=sys.stderr)\n"
            "display(HTML('<i>h</i>'))\nh = display('a', display_id=True)\nh.update('b')\n'result'")
    msg_id = kc.execute(code)
    reply = shell_reply(kc, msg_id)["content"]
    msgs = collect(kc, msg_id)
    types = [m["msg_type"] for m in msgs]
    assert types[:2] == ["status", "execute_input"], types
    assert types[-1] == "status" and msgs[-1]["content"]["execution_state"] == "idle"
    assert types[2:-1] == ["stream", "stream", "display_data", "display_data", "update_display_data",
                           "execute_result"], types
    assert msgs[1]["content"]["execution_count"] == reply["execution_count"]
    assert msgs[-2]["content"]["execution_count"] == reply["execution_count"]
    display_id = msgs[5]["content"]["transient"]["display_id"]
    assert msgs[6]["content"]["transient"]["display_id"] == display_id
    # nothing of this request arrives after idle
    with pytest.raises(Empty):
        while True:
            late = kc.get_iopub_msg(timeout=0.3)
            assert late["parent_header"].get("msg_id") != msg_id, late


def test_execution_counts_are_the_kernels(kc: BlockingKernelClient) -> None:
    first, _ = execute(kc, "1")
    magic, _ = execute(kc, "%sandbox help")
    second, msgs = execute(kc, "2")
    assert magic["execution_count"] == first["execution_count"] + 1
    assert second["execution_count"] == first["execution_count"] + 2
    assert [m["content"]["execution_count"] for m in msgs if m["msg_type"] == "execute_result"] == \
        [second["execution_count"]]
    silent, msgs = execute(kc, "3", silent=True)
    assert silent["status"] == "ok" and not msgs
    assert execute(kc, "4")[0]["execution_count"] == second["execution_count"] + 1


def test_streams_are_batched_and_live(kc: BlockingKernelClient) -> None:
    reply, msgs = execute(kc, "for i in range(2000): print(i)")
    assert reply["status"] == "ok"
    assert stream_text(msgs) == "".join(f"{i}\n" for i in range(2000))
    assert len(msgs) < 100, f"{len(msgs)} stream messages for 2000 prints: not batched"
    reply, msgs = execute(kc, "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.5)")
    assert stream_text(msgs) == "0\n1\n2\n"
    # live: the first line was forwarded while the cell still ran, not all at the end
    assert msgs[-1]["_received"] - msgs[0]["_received"] > 0.5


def test_clear_output_wait(kc: BlockingKernelClient) -> None:
    reply, msgs = execute(kc, "from IPython.display import clear_output\nfor i in range(3):\n"
                              "    clear_output(wait=True); print(f'step {i}')")
    assert reply["status"] == "ok"
    clears = [m for m in msgs if m["msg_type"] == "clear_output"]
    assert len(clears) == 3 and all(m["content"]["wait"] for m in clears)


# ---- crashes, timeouts, interrupts -----------------------------------------------------------

def test_guest_crash_rolls_back_one_cell(kc: BlockingKernelClient) -> None:
    execute(kc, "crash_survivor = 'kept'")
    reply, msgs = execute(kc, "crash_survivor = 'lost'\nimport ctypes\nctypes.string_at(0)")
    assert reply["status"] == "error" and reply["ename"] == "SandboxCrashed", reply
    assert "rolled back" in reply["evalue"]
    assert [m["msg_type"] for m in msgs] == ["error"]
    assert msgs[0]["content"]["ename"] == "SandboxCrashed"
    assert value_of(kc, "crash_survivor") == "'kept'"


def test_timeout_rolls_back(kc: BlockingKernelClient) -> None:
    execute(kc, "timeout_state = 1")
    reply, msgs = execute(kc, "%sandbox timeout 1")
    assert reply["status"] == "ok" and "1 s" in stream_text(msgs)
    try:
        reply, msgs = execute(kc, "timeout_state = 2\nwhile True: pass", timeout=30)
        assert reply["status"] == "error" and reply["ename"] == "SandboxTimeout", reply
        assert any(m["msg_type"] == "error" for m in msgs)
    finally:
        execute(kc, "%sandbox timeout 0")
    assert value_of(kc, "timeout_state") == "1"
    assert "none" in stream_text(execute(kc, "%sandbox timeout")[1])


def _interrupt_after(kc: BlockingKernelClient, code: str, delay: float) -> tuple[dict[str, Any], float]:
    """Start a cell, interrupt it after `delay`; returns (reply, seconds from interrupt to reply)."""
    msg_id = kc.execute(code)
    time.sleep(delay)
    assert _control(kc, "interrupt_request")["content"]["status"] == "ok"
    t0 = time.monotonic()
    reply = shell_reply(kc, msg_id, timeout=30)["content"]
    elapsed = time.monotonic() - t0
    collect(kc, msg_id)
    return reply, elapsed


def test_interrupt_keyboardinterrupt_in_guest(kc: BlockingKernelClient) -> None:
    execute(kc, "interrupt_state = 'before'")
    reply, elapsed = _interrupt_after(kc, "interrupt_state = 'during'\nwhile True: pass", 0.5)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert elapsed < GRACE + 1.0, f"interrupt took {elapsed:.2f} s"
    # KeyboardInterrupt keeps the cell's side effects, as in ipykernel; the state is usable
    assert value_of(kc, "interrupt_state") == "'during'"


def test_interrupt_of_a_cell_stuck_in_c_rolls_back(kc: BlockingKernelClient) -> None:
    execute(kc, "stuck_state = 'before'")
    code = ("stuck_state = 'during'\nfor i in range(3):\n    try:\n        sum(range(10**13))\n"
            "    except KeyboardInterrupt:\n        pass")
    reply, elapsed = _interrupt_after(kc, code, 0.5)
    assert reply["status"] == "error", reply
    assert reply["ename"] != "KeyboardInterrupt", reply
    assert "interrupt" in reply["evalue"] and "rolled back" in reply["evalue"], reply["evalue"]
    assert elapsed < GRACE + 5.0, f"rollback took {elapsed:.2f} s"
    assert value_of(kc, "stuck_state") == "'before'"


def test_interrupt_when_idle_is_harmless(kc: BlockingKernelClient) -> None:
    assert _control(kc, "interrupt_request")["content"]["status"] == "ok"
    assert value_of(kc, "6*7") == "42"


# ---- stdin ------------------------------------------------------------------------------------

def _answer_input(kc: BlockingKernelClient, code: str, answer: str) -> tuple[dict[str, Any], dict[str, Any]]:
    msg_id = kc.execute(code, allow_stdin=True)
    request = kc.get_stdin_msg(timeout=TIMEOUT)
    assert request["msg_type"] == "input_request"
    assert request["parent_header"]["msg_id"] == msg_id
    kc.input(answer)
    reply = shell_reply(kc, msg_id)["content"]
    collect(kc, msg_id)
    return request["content"], reply


def test_input_round_trip(kc: BlockingKernelClient) -> None:
    request, reply = _answer_input(kc, "typed = input('who? ')", "zeroboot")
    assert request == {"prompt": "who? ", "password": False}
    assert reply["status"] == "ok"
    assert value_of(kc, "typed") == "'zeroboot'"


def test_getpass_sets_the_password_flag(kc: BlockingKernelClient) -> None:
    request, reply = _answer_input(kc, "import getpass\nsecret = getpass.getpass('pw: ')", "s3cret")
    assert request == {"prompt": "pw: ", "password": True}
    assert reply["status"] == "ok"
    assert value_of(kc, "secret") == "'s3cret'"


def test_input_without_stdin_fails_at_once(kc: BlockingKernelClient) -> None:
    reply, msgs = execute(kc, "input('never asked')", allow_stdin=False, timeout=20)
    assert reply["status"] == "error" and reply["ename"] == "StdinNotImplementedError", reply


def test_interrupt_while_waiting_for_input(kc: BlockingKernelClient) -> None:
    msg_id = kc.execute("waited = input('waiting: ')", allow_stdin=True)
    assert kc.get_stdin_msg(timeout=TIMEOUT)["msg_type"] == "input_request"
    assert _control(kc, "interrupt_request")["content"]["status"] == "ok"
    reply = shell_reply(kc, msg_id, timeout=30)["content"]
    collect(kc, msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert value_of(kc, "1+1") == "2"  # the kernel is not stuck waiting for the abandoned answer


def test_interrupt_at_the_debugger_prompt_ends_the_debugger(kc: BlockingKernelClient) -> None:
    """pdb is IPython's InterruptiblePdb, as under ipykernel: an interrupt at its prompt ends the
    debugger (--KeyboardInterrupt--) and the program goes on, instead of a cell stuck in pdb."""
    msg_id = kc.execute("import pdb\ndef stopped():\n    pdb.set_trace()\n    return 5\nstopped()", allow_stdin=True)
    request = kc.get_stdin_msg(timeout=TIMEOUT)
    assert request["content"]["prompt"].strip() == "ipdb>", request["content"]
    assert _control(kc, "interrupt_request")["content"]["status"] == "ok"
    reply = shell_reply(kc, msg_id, timeout=30)["content"]
    msgs = collect(kc, msg_id)
    assert reply["status"] == "ok", reply
    assert "--KeyboardInterrupt--" in plain(stream_text(msgs)) and result_text(msgs) == "5"


# ---- kernel magics and modes -----------------------------------------------------------------

def test_rewind(kc: BlockingKernelClient) -> None:
    execute(kc, "rw = [1]")
    execute(kc, "rw.append(2)")
    execute(kc, "rw.append(3)")
    reply, msgs = execute(kc, "%rewind")
    assert reply["status"] == "ok" and "rewound 1" in stream_text(msgs)
    assert value_of(kc, "rw") == "[1, 2]"
    # `%rewind 2`: the value_of cell above counts as one of the two
    reply, msgs = execute(kc, "%rewind 2")
    assert reply["status"] == "ok", reply
    assert value_of(kc, "rw") == "[1]"
    reply, msgs = execute(kc, "%rewind 100000")
    assert reply["status"] == "error" and "checkpoint" in reply["evalue"], reply
    reply, msgs = execute(kc, "%rewind 0")
    assert reply["status"] == "error" and reply["ename"] == "UsageError", reply


def test_rewind_then_code_in_one_cell(kc: BlockingKernelClient) -> None:
    execute(kc, "combo = 'a'")
    execute(kc, "combo = 'b'")
    assert value_of(kc, "%rewind\ncombo") == "'a'"


def test_sandbox_checkpoints_and_stats(kc: BlockingKernelClient) -> None:
    execute(kc, "cp_marker = 1")
    reply, msgs = execute(kc, "%sandbox checkpoints")
    assert reply["status"] == "ok" and "cp_marker = 1" in stream_text(msgs)
    reply, msgs = execute(kc, "%sandbox stats")
    text = stream_text(msgs)
    for needle in ("chained", "checkpoint (fork point) p50", "memory of the live fork", "template", "MiB"):
        assert needle in text, text


def test_magic_errors_are_clear(kc: BlockingKernelClient) -> None:
    reply, msgs = execute(kc, "%sandbox frobnicate")
    assert reply["status"] == "error" and reply["ename"] == "UsageError"
    assert "unknown %sandbox subcommand 'frobnicate'" in reply["evalue"]
    assert [m["msg_type"] for m in msgs] == ["error"]
    reply, _ = execute(kc, "late_magic = 1\n%sandbox stats")
    assert reply["status"] == "error" and "before any code" in reply["evalue"]
    assert value_of(kc, "'late_magic' in globals()") == "False"  # nothing of that cell ran
    help_reply, msgs = execute(kc, "%sandbox help")
    assert "%rewind [N]" in stream_text(msgs)


def test_isolated_mode_switch(kc: BlockingKernelClient) -> None:
    execute(kc, "chained_var = 'chained'")
    reply, msgs = execute(kc, "%sandbox mode isolated")
    assert reply["status"] == "ok" and "isolated" in stream_text(msgs)
    try:
        assert value_of(kc, "'chained_var' in globals()") == "False"
        execute(kc, "isolated_var = 1")
        assert value_of(kc, "'isolated_var' in globals()") == "False"
        assert "isolated" in stream_text(execute(kc, "%sandbox mode")[1])
        reply, _ = execute(kc, "%rewind")
        assert reply["status"] == "error" and "chained" in reply["evalue"]
    finally:
        reply, msgs = execute(kc, "%sandbox mode chained")
    assert reply["status"] == "ok"
    assert value_of(kc, "chained_var") == "'chained'"


def test_stop_on_error_aborts_queued_cells(kc: BlockingKernelClient) -> None:
    ids = [kc.execute("raise ValueError('first')"), kc.execute("queued_1 = 1"), kc.execute("queued_2 = 2")]
    replies = [shell_reply(kc, i)["content"] for i in ids]
    for i in ids:
        collect(kc, i)
    assert replies[0]["status"] == "error"
    assert [r["status"] for r in replies[1:]] == ["aborted", "aborted"]
    assert value_of(kc, "'queued_1' in globals() or 'queued_2' in globals()") == "False"
    # stop_on_error=False: the next cells still run
    ids = [kc.execute("raise ValueError('x')", stop_on_error=False), kc.execute("ran_anyway = 1")]
    replies = [shell_reply(kc, i)["content"] for i in ids]
    for i in ids:
        collect(kc, i)
    assert [r["status"] for r in replies] == ["error", "ok"]


def test_completion_and_inspection_see_live_state_without_changing_it(kc: BlockingKernelClient) -> None:
    execute(kc, "class Probe:\n    '''probe doc'''\n    calls = 0\n    def zz_method(self): pass\n"
                "probe_obj = Probe()")
    code = "x = probe_obj.zz_"
    content = shell_reply(kc, kc.complete(code))["content"]
    completed = [code[:content["cursor_start"]] + m + code[content["cursor_end"]:] for m in content["matches"]]
    assert completed == ["x = probe_obj.zz_method"], content
    msg_id = kc.inspect("probe_obj", detail_level=0)
    content = shell_reply(kc, msg_id)["content"]
    assert content["found"] and "probe doc" in plain(content["data"]["text/plain"])
    # completion ran in a throwaway copy: a getter with a side effect leaves no trace
    execute(kc, "class Sneaky:\n    @property\n    def attr(self):\n        Probe.calls += 1\n        return 1\n"
                "sneaky = Sneaky()")
    shell_reply(kc, kc.complete("sneaky.attr.re"))
    assert value_of(kc, "Probe.calls") == "0"


def test_history_records_cells(kc: BlockingKernelClient) -> None:
    execute(kc, "hist_marker_value = 7*6")
    execute(kc, "hist_marker_value")
    content = shell_reply(kc, kc.history(hist_access_type="search", pattern="hist_marker*", output=True,
                                         raw=True))["content"]
    sources = [h[2][0] for h in content["history"]]
    assert sources[-2:] == ["hist_marker_value = 7*6", "hist_marker_value"]
    assert content["history"][-1][2][1] == "42"


def test_user_expressions(kc: BlockingKernelClient) -> None:
    execute(kc, "ue = 21")
    reply, _ = execute(kc, "ue2 = ue * 2", user_expressions={"v": "ue2", "bad": "1/0"})
    assert reply["user_expressions"]["v"]["data"]["text/plain"] == "42"
    assert reply["user_expressions"]["bad"]["status"] == "error"
    reply, msgs = execute(kc, "", user_expressions={"v": "ue"})  # an empty cell still evaluates them
    assert reply["status"] == "ok" and reply["user_expressions"]["v"]["data"]["text/plain"] == "21"
    assert not msgs


def test_sandbox_reset(kc: BlockingKernelClient) -> None:
    execute(kc, "reset_me = 1")
    reply, msgs = execute(kc, "%sandbox reset")
    assert reply["status"] == "ok" and "clean" in stream_text(msgs)
    assert value_of(kc, "'reset_me' in globals()") == "False"
    reply, _ = execute(kc, "%rewind 2")  # the reset dropped every checkpoint before it
    assert reply["status"] == "error" and "checkpoint" in reply["evalue"]


def test_no_subshells(kc: BlockingKernelClient) -> None:
    reply = _control(kc, "create_subshell_request")
    assert reply["content"]["status"] == "error" and "subshell" in reply["content"]["evalue"]
    collect(kc, reply["_sent_id"])


# ---- threads between cells (issue 14) ------------------------------------------------------

def test_threads_keep_running_between_cells(kc: BlockingKernelClient) -> None:
    """As under ipykernel: a background thread runs while the kernel waits for the next cell (the
    engine process runs it until the request arrives), and a cell sent meanwhile is served."""
    reply, _ = execute(kc, "import threading, time\nbg_ticks, bg_stop = [], threading.Event()\n"
                           "def bg_tick():\n"
                           "    while not bg_stop.is_set():\n"
                           "        bg_ticks.append(1); time.sleep(0.02)\n"
                           "threading.Thread(target=bg_tick, daemon=True).start()\nbg_n = len(bg_ticks)")
    assert reply["status"] == "ok", reply
    time.sleep(1.0)  # real time between the cells: ~50 ticks under ipykernel
    reply, msgs = execute(kc, "print(len(bg_ticks) - bg_n > 10)")
    assert reply["status"] == "ok" and stream_text(msgs) == "True\n", (reply, msgs)
    for _ in range(3):  # quick cells while the thread runs: each request stops the run at once
        assert value_of(kc, "1+1") == "2"
    reply, msgs = execute(kc, "bg_stop.set(); time.sleep(0.1); print(threading.active_count())")
    assert stream_text(msgs) == "1\n", msgs
