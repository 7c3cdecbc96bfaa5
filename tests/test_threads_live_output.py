"""Output a background thread prints between cells reaches the frontend as it comes, with the
parent header ipykernel gives it, checked against the stock kernel (ipykernel, `python3`) side by
side: ipykernel's OutStream, in a thread that set no parent of its own, uses the parent of the
latest shell request, so a thread started by cell A prints into A until another request comes,
and into cell B once B was sent. Nothing here waits for a time to pass: the thread's lines must
arrive with no further request (before issue 14's live output, the zeroboot kernel held them for
the next cell)."""
from __future__ import annotations

import time
from queue import Empty
from typing import Any

import pytest

from kernel_helpers import TIMEOUT, collect, kernel

THREAD = ("import threading, time\n"
          "go = threading.Event()\n"
          "def talk():\n"
          "    time.sleep(0.3)\n"           # usually after the cell's reply: the path between cells
          "    for i in range(3):\n"
          "        print('tick', i, flush=True); time.sleep(0.05)\n"
          "    go.wait()\n"
          "    print('after go', flush=True)\n"
          "threading.Thread(target=talk, daemon=True).start()\n")


def stdout_of(msgs: list[dict[str, Any]], texts: dict[str, str]) -> dict[str, str]:
    """Add the stdout text of these IOPub messages to `texts` (by parent msg_id)."""
    for msg in msgs:
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            parent = msg["parent_header"].get("msg_id", "")
            texts[parent] = texts.get(parent, "") + msg["content"]["text"]
    return texts


def stream_until(kc: Any, wanted: str, texts: dict[str, str], timeout: float = TIMEOUT) -> dict[str, str]:
    """stdout text by parent msg_id (added to `texts`), read from IOPub until `wanted` is in it,
    with no request sent meanwhile."""
    deadline = time.monotonic() + timeout
    while not any(wanted in t for t in texts.values()):
        left = deadline - time.monotonic()
        assert left > 0, f"{wanted!r} did not arrive without a request; got {texts}"
        try:
            msg = kc.get_iopub_msg(timeout=min(left, 1.0))
        except Empty:
            continue
        stdout_of([msg], texts)
    return texts


@pytest.mark.parametrize("name", ["python3", "zeroboot"])
def test_thread_output_between_cells_goes_out_live_to_the_latest_cell(name: str) -> None:
    with kernel(name) as (_, kc):
        a = kc.execute(THREAD)
        # (under load the thread may begin before the reply: those lines are cell A's output too)
        first = stream_until(kc, "tick 2", stdout_of(collect(kc, a), {}))
        assert set(first) == {a}, first  # cell A's parent, and nothing else
        assert first[a] == "tick 0\ntick 1\ntick 2\n", first
        b = kc.execute("go.set()")
        after = stream_until(kc, "after go", {})
        assert after.get(b, "") == "after go\n", (a, b, after)  # the latest request's parent


def test_engine_without_live_output_gives_thread_output_to_the_next_cell() -> None:
    """Batch runs and papermill start their engine without the idle channel: what a thread prints
    between cells is held by the engine and begins the next cell's output (never lost)."""
    from zeroboot_kernel import engine_requests as req
    from zeroboot_kernel.engine_client import EngineClient

    def run(client: EngineClient, code: str, count: int) -> str:
        out = []
        for ev in client.request(req.EXECUTE, code=code, execution_count=count):
            if ev["event"] == "stream":
                out.append(ev["text"])
            elif ev["event"] == "reply":
                assert ev["content"]["status"] == "ok", ev
        return "".join(out)

    client = EngineClient()
    try:
        assert client.idle_sock is None
        first = run(client, "import threading, time\ndone = threading.Event()\n"
                            "def talk():\n    time.sleep(0.5); print('late'); done.wait()\n"
                            "threading.Thread(target=talk, daemon=True).start()", 1)
        time.sleep(3)  # the engine runs the thread between the cells (a hang guard, not a condition)
        second = run(client, "print('next'); done.set()", 2)
        assert (first + second).count("late\n") == 1 and second.endswith("next\n"), (first, second)
    finally:
        client.close()
