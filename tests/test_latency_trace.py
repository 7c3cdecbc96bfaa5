"""The latency stamps of ZEROBOOT_TRACE=1 (zeroboot_kernel/latency_trace.py, issue 20): hostile
stamps from the guest are dropped, a traced cell collects every engine and guest stamp, an untraced
one asks the agent for none, and the kernel puts them into the execute_reply's metadata."""
from __future__ import annotations

import json
from typing import Any

import pytest

from zeroboot_kernel import frames, latency_trace
from zeroboot_kernel.bench import latency
from zeroboot_kernel.frames import FrameType


def test_guest_stamps_accept_only_a_list_of_in_range_ints() -> None:
    assert latency_trace.guest_stamps([1, 2, 3, 4]) == dict(zip(latency_trace.GUEST_STAMPS, [1, 2, 3, 4]))
    for hostile in (None, "1234", {"g_read": 1}, [1, 2, 3], [1, 2, 3, 4, 5], [[1]] * 4, list(range(10**6))):
        assert latency_trace.guest_stamps(hostile) == {}
    # one bad element drops that stamp only
    got = latency_trace.guest_stamps([True, -1, 1 << 63, 7.5])
    assert got == {}
    assert latency_trace.guest_stamps([1, "2", 3, None]) == {"g_read": 1, "g_run_end": 3}


def test_checked_keeps_only_known_fields() -> None:
    got = latency_trace.checked({"e_recv": 5, "k_enter": 6, "evil": 7, "g_read": "x", "exits": 3, "run_ns": 1 << 64})
    assert got == {"e_recv": 5, "k_enter": 6, "exits": 3}
    assert latency_trace.checked(["e_recv", 1]) == {}


def test_done_frame_trace_is_checked_by_decode() -> None:
    def done(trace: Any) -> dict[str, Any]:
        body = json.dumps({"id": 1, "status": "ok", "execution_count": 1, "user_expressions": {}, "payload": [],
                           "trace": trace, "seq": 0, "stream_chars": 0}).encode()
        return frames.decode(FrameType.DONE, body)

    assert done([10, 20, 30, 40])["trace"] == dict(zip(latency_trace.GUEST_STAMPS, [10, 20, 30, 40]))
    assert done({"__class__": 1})["trace"] == {}
    assert done("x" * 1000)["trace"] == {}


def test_phases_from_stamps() -> None:
    stamps = {"c_send": 0, "busy": 1_000_000, "started": 1_500_000, "reply": 4_000_000, "idle": 4_500_000,
              "c_idle": 5_000_000, "e_ckpt_start": 100, "e_ckpt_end": 2_000_100, "k_sent": 2_000_000}
    got = latency.phases(stamps)
    assert got["execute (started -> execute_reply sent)"] == 2.5
    assert got["round trip (client send -> idle received)"] == 5.0
    assert "kernel -> engine (socketpair, engine wake-up)" not in got  # no such stamps
    extras = latency.extras(stamps)
    assert extras["checkpoint after the previous reply (ms)"] == 2.0
    assert extras["request waited for that checkpoint (ms)"] == pytest.approx(0.0001)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def traced(template: Any, monkeypatch_module: pytest.MonkeyPatch) -> Any:
    """A session of an engine with tracing on (as ZEROBOOT_TRACE=1 at import would make it)."""
    monkeypatch_module.setattr(latency_trace, "ENABLED", True)
    from zeroboot_kernel.session import Session

    s = Session(template)
    yield s
    s.close()


def test_a_traced_cell_has_every_engine_and_guest_stamp(traced: Any) -> None:
    s = traced
    trace: dict[str, int] = {}
    reply = s.execute("print(1)", execution_count=1, trace=trace)
    assert reply["status"] == "ok" and "trace" not in reply
    s.prepare_next_cell()
    for name in latency_trace.GUEST_STAMPS + ("e_push", "e_done", "e_settled", "exits", "syscalls", "run_ns"):
        assert name in trace, name
    assert trace["e_push"] <= trace["e_done"] <= trace["e_settled"]
    g = [trace[n] for n in latency_trace.GUEST_STAMPS]
    assert g == sorted(g)  # one clock in the guest: never backwards
    assert trace["exits"] >= 1
    # the next cell reports the checkpoint taken after this one's reply
    trace2: dict[str, int] = {}
    s.execute("1+1", execution_count=2, trace=trace2)
    assert trace2["e_ckpt_start"] <= trace2["e_ckpt_end"] <= trace2["e_push"]


def test_an_untraced_cell_asks_the_agent_for_no_stamps(traced: Any) -> None:
    pushed: list[bytes] = []
    guest = traced.sandbox.guest
    real = guest.push_input

    def spy(data: bytes) -> None:
        pushed.append(bytes(data))
        real(data)

    guest.push_input = spy
    try:
        reply = traced.execute("1+1", execution_count=3)
    finally:
        del guest.push_input
    assert reply["status"] == "ok" and "trace" not in reply
    assert pushed and b'"trace"' not in pushed[0]


def test_user_code_replacing_the_clock_does_not_reach_the_stamps(traced: Any) -> None:
    """The agent bound monotonic_ns at import: a cell that replaces time.monotonic_ns (hostile or
    not) neither breaks the traced cells after it nor feeds their stamps."""
    assert traced.execute("import time; time.monotonic_ns = lambda: 'x'", execution_count=4)["status"] == "ok"
    trace: dict[str, int] = {}
    reply = traced.execute("1+1", execution_count=5, trace=trace)
    assert reply["status"] == "ok"
    assert all(name in trace for name in latency_trace.GUEST_STAMPS)


def test_kernel_reply_metadata_carries_the_trace() -> None:
    from kernel_helpers import kernel, shell_reply

    with kernel("zeroboot", ZEROBOOT_TRACE="1") as (_km, kc):
        for _ in range(2):
            msg_id = kc.execute("1+1")
            reply = shell_reply(kc, msg_id)
        trace = reply["metadata"].get("zeroboot_trace")
        assert isinstance(trace, dict)
        for name in latency_trace.KERNEL_STAMPS + latency_trace.GUEST_STAMPS + ("e_recv", "e_reply", "e_ckpt_end"):
            assert name in trace, name
        assert trace["k_enter"] <= trace["k_worker"] <= trace["k_sent"] <= trace["e_recv"]
        assert trace["e_reply"] <= trace["k_reply_in"] <= trace["k_back"]
    with kernel("zeroboot") as (_km, kc):
        msg_id = kc.execute("1+1")
        assert "zeroboot_trace" not in shell_reply(kc, msg_id)["metadata"]


def test_cell_file_names_are_ipykernels() -> None:
    from ipykernel.compiler import get_file_name

    from zeroboot_guest._zeroboot_agent.agent_shell import CellCompiler

    compiler = CellCompiler()
    for code in ("1+1", "print('é')", "", "def f():\n    return 1\n"):
        assert compiler.get_code_name(code, None, 0) == get_file_name(code)


def test_a_cell_makes_no_getpid(traced: Any) -> None:
    """ipykernel's compiler asks the pid for every cell's file name: a VM exit the agent saves."""
    guest = traced.sandbox.guest
    guest.set_profile(True)
    try:
        assert traced.execute("1+1", execution_count=6)["status"] == "ok"
        calls = guest.syscall_profile_by_number()
    finally:
        guest.set_profile(False)
    assert "getpid" not in calls, calls
