"""The agent's comms (guest/_zeroboot_agent/agent_comm.py) over the documented frames, with the
agent as a host process (no VM): COMM_MESSAGE frames with raw binary buffers, the frontend's COMM
requests dispatched to targets and callbacks, COMM_INFO, the parent header Output widgets use.
The kernel-level behaviour (IOPub, differential with ipykernel) is in tests/test_comms.py."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from frame_spec import COMM, COMM_DONE, COMM_INFO, COMM_INFO_REPLY, COMM_MESSAGE, ERROR, EXECUTE, pack_comm
from test_agent_host import AgentProcess, Frame, done, only, stdout_text

pytestmark = pytest.mark.without_kvm

PARENT = {"msg_id": "parent-1", "msg_type": "execute_request", "session": "s", "username": "u", "date": "d",
          "version": "5.4"}


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    proc = AgentProcess("")
    yield proc
    proc.close()


def comm_request(agent: AgentProcess, buffers: list[bytes] | None = None, **message: Any) -> list[Frame]:
    """One COMM request; its frames up to and including COMM_DONE."""
    rid = agent.next_id
    agent.next_id += 1
    agent.send(COMM, {"id": rid, "parent_header": {**PARENT, "msg_id": f"comm-{rid}", "msg_type": message["kind"]},
                      "data": {}, "metadata": {}, **message}, buffers)
    frames = []
    while True:
        frame = agent.recv()
        frames.append(frame)
        if frame.type == COMM_DONE:
            assert frame.payload["id"] == rid
            return frames


def test_a_widget_opens_its_comm_with_its_state(agent: AgentProcess) -> None:
    rid = agent.start_execute("import ipywidgets as w\ns = w.IntSlider(value=3)\ns.comm.comm_id")
    frames = agent.until_done(rid)
    assert done(frames)["status"] == "ok", frames
    opens = [f.payload for f in only(frames, COMM_MESSAGE) if f.payload["kind"] == "comm_open"]
    slider = [p for p in opens if p["data"]["state"]["_model_name"] == "IntSliderModel"]
    assert len(slider) == 1 and slider[0]["data"]["state"]["value"] == 3
    assert slider[0]["target_name"] == "jupyter.widget" and slider[0]["metadata"] == {"version": "2.1.0"}


def test_the_parent_header_is_the_kernels(agent: AgentProcess) -> None:
    rid = agent.next_id
    agent.next_id += 1
    agent.count += 1
    agent.send(EXECUTE, {"id": rid, "code": "print(get_ipython().kernel.get_parent()['header']['msg_id'])",
                       "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
                       "execution_count": agent.count, "reseed": None, "parent_header": PARENT})
    assert stdout_text(agent.until_done(rid)) == "parent-1\n"


def test_buffers_cross_as_raw_bytes_both_ways(agent: AgentProcess) -> None:
    setup = ("import comm\n"
             "def opened(c, msg):\n"
             "    c.on_msg(lambda m: c.send({'n': len(m['buffers']), 'got': m['content']['data']},\n"
             "                              buffers=[bytes(b)[::-1] for b in m['buffers']]))\n"
             "comm.get_comm_manager().register_target('echo', opened)")
    assert done(agent.execute(setup))["status"] == "ok"
    frames = comm_request(agent, kind="comm_open", comm_id="echo-1", target_name="echo")
    assert frames[-1].payload["status"] == "ok" and len(frames) == 1
    blobs = [b"\x00\x01\x02" * 1000, bytes(range(256)), b""]
    frames = comm_request(agent, blobs, kind="comm_msg", comm_id="echo-1", data={"x": 1})
    [reply] = only(frames, COMM_MESSAGE)
    assert reply.payload["kind"] == "comm_msg" and reply.payload["comm_id"] == "echo-1"
    assert reply.payload["data"] == {"n": 3, "got": {"x": 1}}
    assert reply.payload["buffers"] == [b[::-1] for b in blobs]


def test_callbacks_see_the_comm_messages_parent_and_print(agent: AgentProcess) -> None:
    setup = ("import comm\n"
             "def opened(c, msg):\n"
             "    c.on_msg(lambda m: print('parent', get_ipython().kernel.get_parent()['header']['msg_id']))\n"
             "comm.get_comm_manager().register_target('who', opened)")
    assert done(agent.execute(setup))["status"] == "ok"
    comm_request(agent, kind="comm_open", comm_id="who-1", target_name="who")
    frames = comm_request(agent, kind="comm_msg", comm_id="who-1")
    assert stdout_text(frames) == f"parent comm-{agent.next_id - 1}\n"


def test_a_failing_callback_is_reported_not_fatal(agent: AgentProcess) -> None:
    setup = ("import comm\n"
             "def opened(c, msg):\n"
             "    def boom(m): raise KeyboardInterrupt('from a callback')\n"
             "    c.on_msg(boom)\n"
             "comm.get_comm_manager().register_target('boom', opened)")
    assert done(agent.execute(setup))["status"] == "ok"
    comm_request(agent, kind="comm_open", comm_id="boom-1", target_name="boom")
    frames = comm_request(agent, kind="comm_msg", comm_id="boom-1")
    assert frames[-1].payload["status"] == "error" and frames[-1].payload["ename"] == "KeyboardInterrupt"
    assert only(frames, ERROR)
    assert done(agent.execute("1 + 1"))["status"] == "ok"


def test_comm_info_lists_and_filters_the_registry(agent: AgentProcess) -> None:
    every = agent.request(COMM_INFO, COMM_INFO_REPLY, target_name=None, sync=None)["comms"]
    assert {"echo-1", "who-1", "boom-1"} <= set(every)
    echo = agent.request(COMM_INFO, COMM_INFO_REPLY, target_name="echo", sync=None)["comms"]
    assert echo == {"echo-1": {"target_name": "echo"}}


def test_a_frontend_close_unregisters(agent: AgentProcess) -> None:
    frames = comm_request(agent, kind="comm_close", comm_id="who-1")
    assert frames[-1].payload["status"] == "ok"
    assert "who-1" not in agent.request(COMM_INFO, COMM_INFO_REPLY, target_name=None, sync=None)["comms"]


def test_resync_closes_silently_what_the_frontend_lacks_and_resends_widget_state(agent: AgentProcess) -> None:
    code = "import ipywidgets as w\nt = w.IntSlider(value=5)\nprint(t.model_id)"
    frames = agent.execute(code)
    model = stdout_text(frames).strip()
    every = agent.request(COMM_INFO, COMM_INFO_REPLY, target_name=None, sync=None)["comms"]
    # a widget the frontend never heard of (opened after the state the host restored)
    frames = agent.execute("u = w.Button()\nprint(u.model_id)")
    lost = stdout_text(frames).strip()
    keep = list(every)
    rid = agent.next_id
    agent.next_id += 1
    agent.send(COMM_INFO, {"id": rid, "target_name": None, "sync": keep})
    frames = []
    while True:
        frame = agent.recv()
        frames.append(frame)
        if frame.type == COMM_INFO_REPLY:
            break
    assert lost not in frames[-1].payload["comms"] and set(frames[-1].payload["comms"]) == set(every)
    states = {f.payload["comm_id"]: f.payload for f in only(frames, COMM_MESSAGE)}
    assert lost not in states  # closed without a message
    assert states[model]["kind"] == "comm_msg" and states[model]["data"]["method"] == "update"
    assert states[model]["data"]["state"]["value"] == 5
    frames = agent.execute("from ipywidgets.widgets.widget import _instances\n"
                           f"print(t.comm is not None, u.comm is None, {lost!r} in _instances)")
    assert stdout_text(frames) == "True True False\n"


def test_too_many_buffers_is_a_clear_error_in_the_cell(agent: AgentProcess) -> None:
    code = ("import comm\nc = comm.create_comm(target_name='x')\n"
            "c.send({}, buffers=[b'x'] * 65)")
    reply = done(agent.execute(code))
    assert reply["status"] == "error" and reply["ename"] == "ValueError" and "at most 64" in reply["evalue"]


def test_the_binary_layout_is_the_documented_one(agent: AgentProcess) -> None:
    # a COMM frame written by hand from PROTOCOL.md's layout (frame_spec.pack_comm)
    setup = ("import comm\n"
             "def opened(c, msg): c.on_msg(lambda m: print([bytes(b) for b in m['buffers']]))\n"
             "comm.get_comm_manager().register_target('show', opened)")
    assert done(agent.execute(setup))["status"] == "ok"
    comm_request(agent, kind="comm_open", comm_id="show-1", target_name="show")
    frames = comm_request(agent, [b"ab", b"\xff"], kind="comm_msg", comm_id="show-1")
    assert stdout_text(frames) == "[b'ab', b'\\xff']\n"
    assert pack_comm(b"{}", [b"ab"]) == b"\x02\x00\x00\x00{}\x01\x00\x00\x00\x02\x00\x00\x00ab"


def test_an_interrupt_stops_a_looping_callback(agent: AgentProcess) -> None:
    import os
    import signal

    setup = ("import comm\n"
             "def opened(c, msg):\n"
             "    def spin(m):\n"
             "        print('spinning', flush=True)\n"
             "        while True:\n"
             "            pass\n"
             "    c.on_msg(spin)\n"
             "comm.get_comm_manager().register_target('spin', opened)")
    assert done(agent.execute(setup))["status"] == "ok"
    comm_request(agent, kind="comm_open", comm_id="spin-1", target_name="spin")
    rid = agent.next_id
    agent.next_id += 1
    agent.send(COMM, {"id": rid, "kind": "comm_msg", "comm_id": "spin-1", "data": {}, "metadata": {},
                      "parent_header": PARENT})
    first = agent.recv()
    assert first.payload.get("text") == "spinning\n", first
    os.kill(agent.proc.pid, signal.SIGINT)
    frames = [agent.recv()]
    while frames[-1].type != COMM_DONE:
        frames.append(agent.recv())
    assert frames[-1].payload["status"] == "error" and frames[-1].payload["ename"] == "KeyboardInterrupt", frames

