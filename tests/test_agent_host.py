"""The guest agent (guest/_zeroboot_agent) run on the host, driven with real frames.

The agent runs as a subprocess of this environment's Python with one end of a socketpair as its
UART (ZEROBOOT_UART_FD). The frame codec here is written from docs/PROTOCOL.md on its own, not
imported from the agent, so a wire-format mistake on either side shows up.
"""
from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# the documented frame protocol, deliberately not the agent's own module (see frame_spec.py)
from frame_spec import (BINARY, CLEAR_OUTPUT, COMM, COMM_DONE, COMM_INFO, COMM_INFO_REPLY, COMPLETE, COMPLETE_REPLY,
                        DISPLAY, DONE, ERROR, EXECUTE, HEADER, INPUT_REPLY, INPUT_REQUEST, INSPECT, INSPECT_REPLY, MAGIC,
                        READY, RESULT, STREAM, pack_comm, unpack_comm)

pytestmark = pytest.mark.without_kvm  # the agent runs as a host process here

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "guest" / "_zeroboot_agent"
PYTHON = REPO / ".venv" / "bin" / "python"


TIMEOUT = 60.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Frame:
    type: int
    payload: dict[str, Any]
    t: float  # time.monotonic() when the frame was complete on the host side


def plain(lines: list[str]) -> str:
    return ANSI.sub("", "\n".join(lines))


class AgentProcess:
    """One agent subprocess and the host end of its UART."""

    def __init__(self, preload: str = "") -> None:
        self.sock, guest_end = socket.socketpair()
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, ZEROBOOT_UART_FD=str(guest_end.fileno()), MPLBACKEND="Agg")
        self.proc = subprocess.Popen([str(PYTHON), str(AGENT), "--preload", preload], env=env,
                                     pass_fds=[guest_end.fileno()], stdout=self.log, stderr=self.log,
                                     cwd=tempfile.gettempdir())
        guest_end.close()
        self.buf = bytearray()
        self.next_id = 1
        self.count = 0
        # the channel's self-check, as the host does it (sandbox._CellRun.check): frames of a
        # request numbered from 0, and the reply's count of stream characters
        self.seq = 0
        self.stream_chars = 0
        # STREAM frames sent between requests (numbered `idle` from 0 after each reply): kept
        # here, never returned by recv
        self.idle = 0
        self.idle_output: list[tuple[str, str]] = []
        self.ready = self.recv()
        assert self.ready.type == READY, self.ready

    # ---- frames ---------------------------------------------------------------------------

    def send(self, ftype: int, payload: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        if ftype in (EXECUTE, COMPLETE, INSPECT, COMM, COMM_INFO):
            self.new_request()
        body = json.dumps(payload).encode()
        if ftype in BINARY:
            body = pack_comm(body, buffers or [])
        self.sock.sendall(HEADER.pack(MAGIC, 1, ftype, len(body)) + body)

    def new_request(self) -> None:
        """A request goes out (send() calls this; a test sending one raw calls it itself)."""
        self.seq = self.stream_chars = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = TIMEOUT) -> Frame:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= HEADER.size:
                magic, version, ftype, length = HEADER.unpack_from(self.buf)
                assert (magic, version) == (MAGIC, 1), f"bad header {bytes(self.buf[:12])!r}"
                assert length <= 16 << 20
                if len(self.buf) >= HEADER.size + length:
                    body = bytes(self.buf[HEADER.size:HEADER.size + length])
                    del self.buf[:HEADER.size + length]
                    buffers: list[bytes] = []
                    if ftype in BINARY:
                        body, buffers = unpack_comm(body)
                    payload = json.loads(body.decode("utf-8"))
                    if ftype in BINARY:
                        payload["buffers"] = buffers
                    if "idle" in payload:
                        self._idle_frame(ftype, payload)
                        continue
                    return self._checked(Frame(ftype, payload, time.monotonic()))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no frame within {timeout} s; agent log:\n{self.agent_log()}")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            if not chunk:
                raise EOFError(f"agent closed the channel; log:\n{self.agent_log()}")
            self.buf += chunk

    def _idle_frame(self, ftype: int, payload: dict[str, Any]) -> None:
        """Output between requests, checked as the host checks it (Sandbox._idle_output)."""
        assert ftype == STREAM and "seq" not in payload and "stream_chars" not in payload, payload
        assert payload["idle"] == self.idle, (self.idle, payload)
        self.idle += 1
        self.idle_output.append((payload["name"], payload["text"]))

    def wait_idle_output(self, done: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        """Read frames until done() (it looks at idle_output); none may be a request's frame."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, (self.idle_output, self.agent_log())
            try:
                frame = self.recv(min(left, 0.5))
            except TimeoutError:
                continue
            raise AssertionError(f"a frame between requests that is not output: {frame}")

    def _checked(self, frame: Frame) -> Frame:
        """Verify and strip the self-check fields, so tests compare the payloads themselves."""
        assert frame.payload.pop("seq", None) == self.seq, (self.seq, frame)
        self.seq += 1
        if frame.type == STREAM:
            self.stream_chars += len(frame.payload["text"])
        if frame.type in (DONE, COMPLETE_REPLY, INSPECT_REPLY, COMM_DONE, COMM_INFO_REPLY):
            assert frame.payload.pop("stream_chars", None) == self.stream_chars, (self.stream_chars, frame)
            self.idle = 0  # the agent numbers its output between requests from 0 again
        return frame

    def agent_log(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    # ---- requests -------------------------------------------------------------------------

    def start_execute(self, code: str, *, allow_stdin: bool = True, silent: bool = False,
                      store_history: bool = True, user_expressions: dict[str, str] | None = None,
                      reseed: str | None = None, execution_count: int | None = None) -> int:
        rid = self.next_id
        self.next_id += 1
        if execution_count is None:
            self.count += 1
            execution_count = self.count
        self.send(EXECUTE, {"id": rid, "code": code, "silent": silent, "store_history": store_history,
                            "user_expressions": user_expressions or {}, "allow_stdin": allow_stdin,
                            "execution_count": execution_count, "reseed": reseed})
        return rid

    def until_done(self, rid: int, on_input: Callable[[Frame], str] | None = None,
                   timeout: float = TIMEOUT) -> list[Frame]:
        frames: list[Frame] = []
        while True:
            frame = self.recv(timeout)
            frames.append(frame)
            if frame.type == DONE:
                assert frame.payload["id"] == rid
                return frames
            if frame.type == INPUT_REQUEST:
                assert on_input is not None, f"unexpected input request {frame.payload}"
                self.send(INPUT_REPLY, {"value": on_input(frame)})

    def execute(self, code: str, on_input: Callable[[Frame], str] | None = None, **kw: Any) -> list[Frame]:
        return self.until_done(self.start_execute(code, **kw), on_input)

    def request(self, ftype: int, reply_type: int, **payload: Any) -> dict[str, Any]:
        """Send a request and return its reply. Output the agent writes before the reply is
        skipped (IPython's module completer prints a note when listing the modules takes over 2 s,
        as on a loaded host); _checked holds it against the reply's stream_chars."""
        rid = self.next_id
        self.next_id += 1
        self.send(ftype, {"id": rid, **payload})
        frame = self.recv()
        while frame.type == STREAM:
            frame = self.recv()
        assert frame.type == reply_type, frame
        assert frame.payload["id"] == rid
        return frame.payload

    def close(self) -> int:
        self.sock.close()
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


def stdout_text(frames: list[Frame], name: str = "stdout") -> str:
    return "".join(f.payload["text"] for f in frames if f.type == STREAM and f.payload["name"] == name)


def only(frames: list[Frame], ftype: int) -> list[Frame]:
    return [f for f in frames if f.type == ftype]


def done(frames: list[Frame]) -> dict[str, Any]:
    assert frames[-1].type == DONE
    assert sum(f.type == DONE for f in frames) == 1
    return frames[-1].payload


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    proc = AgentProcess("numpy,pandas,matplotlib")
    yield proc
    proc.close()


@pytest.fixture
def fresh_agent() -> Iterator[AgentProcess]:
    proc = AgentProcess("")
    yield proc
    proc.close()


# ---- start-up ---------------------------------------------------------------------------------

def test_ready(agent: AgentProcess) -> None:
    ready = agent.ready.payload
    info = ready["language_info"]
    assert info["name"] == "python"
    assert info["version"] == ".".join(map(str, sys.version_info[:3]))
    assert info["mimetype"] == "text/x-python"
    assert info["codemirror_mode"] == {"name": "ipython", "version": 3}
    assert info["pygments_lexer"] == "ipython3"
    assert info["nbconvert_exporter"] == "python"
    assert info["file_extension"] == ".py"
    assert ready["preloaded"] == ["numpy", "pandas", "matplotlib"]
    assert ready["preload_errors"] == []
    assert ready["python_version"] == info["version"]
    assert re.match(r"\d+\.\d+", ready["ipython"])
    assert isinstance(ready["implementation"], str) and ready["implementation"]


def test_preload_failure_is_reported_not_fatal() -> None:
    proc = AgentProcess("json,no_such_module_zb")
    try:
        ready = proc.ready.payload
        assert ready["preloaded"] == ["json"]
        assert len(ready["preload_errors"]) == 1
        assert "no_such_module_zb" in ready["preload_errors"][0]
        assert "ModuleNotFoundError" in ready["preload_errors"][0]
        assert done(proc.execute("print('alive')"))["status"] == "ok"
    finally:
        proc.close()


def test_warm_up_leaves_no_trace(fresh_agent: AgentProcess) -> None:
    frames = fresh_agent.execute("print(sorted(k for k in globals() if k.startswith('_') and k[1:].isdigit()), "
                                 "repr(_), len(In), len(Out))", execution_count=1)
    assert stdout_text(frames) == "[] '' 2 0\n"  # In[0] is '', In[1] this cell
    frames = fresh_agent.execute("import sys; print(getattr(sys, 'last_value', None))", execution_count=2)
    assert stdout_text(frames) == "None\n"


def test_start_up_maps_every_module_file_for_tracebacks(agent: AgentProcess) -> None:
    # A traceback's inspect.getmodule() maps each module it has not seen, with a stat per path
    # component; the template must hold that map complete, or each fork's first error pays it.
    frames = agent.execute("import inspect, sys\n"
                           "print([m for m, v in sys.modules.copy().items() if inspect.ismodule(v) and "
                           "hasattr(v, '__file__') and inspect._filesbymodname.get(m) != v.__file__])",
                           execution_count=1)
    assert stdout_text(frames) == "[]\n"


def test_eof_ends_agent_cleanly(fresh_agent: AgentProcess) -> None:
    fresh_agent.sock.shutdown(socket.SHUT_WR)
    assert fresh_agent.proc.wait(timeout=30) == 0


# ---- execute: output kinds --------------------------------------------------------------------

def test_print_gives_stream_then_done(agent: AgentProcess) -> None:
    frames = agent.execute("print(1+1)", execution_count=5)
    assert [f.type for f in frames] == [STREAM, DONE]
    assert frames[0].payload == {"name": "stdout", "text": "2\n"}
    reply = done(frames)
    assert reply["status"] == "ok"
    assert reply["execution_count"] == 5
    assert reply["user_expressions"] == {}
    assert reply["payload"] == []


def test_expression_gives_result_with_count(agent: AgentProcess) -> None:
    frames = agent.execute("1+1", execution_count=17)
    assert [f.type for f in frames] == [RESULT, DONE]
    assert frames[0].payload["execution_count"] == 17
    assert frames[0].payload["data"] == {"text/plain": "2"}
    assert frames[0].payload["metadata"] == {}
    assert done(frames)["execution_count"] == 17
    # the output cache follows the host's count
    assert stdout_text(agent.execute("print(_17, Out[17])", execution_count=18)) == "2 2\n"


def test_silent_and_semicolon_give_no_result(agent: AgentProcess) -> None:
    assert [f.type for f in agent.execute("1+1", silent=True, store_history=False)] == [DONE]
    assert [f.type for f in agent.execute("1+1;")] == [DONE]


def test_error_traceback(agent: AgentProcess) -> None:
    frames = agent.execute("x = 1\n1/0", execution_count=7)
    assert [f.type for f in frames] == [ERROR, DONE]
    err = frames[0].payload
    assert err["ename"] == "ZeroDivisionError"
    assert err["evalue"] == "division by zero"
    assert isinstance(err["traceback"], list) and all(isinstance(s, str) for s in err["traceback"])
    text = plain(err["traceback"])
    assert "In[7]" in text and "line 2" in text and "1/0" in text
    assert "agent" not in text and "interactiveshell" not in text
    reply = done(frames)
    assert reply["status"] == "error"
    assert (reply["ename"], reply["evalue"]) == ("ZeroDivisionError", "division by zero")
    assert reply["traceback"] == err["traceback"]
    assert reply["execution_count"] == 7
    assert reply["user_expressions"] == {}


def test_error_in_called_function_shows_both_frames(agent: AgentProcess) -> None:
    frames = agent.execute("def f():\n    return undefined_name_zb\nf()")
    err = only(frames, ERROR)[0].payload
    assert err["ename"] == "NameError"
    text = plain(err["traceback"])
    assert "f()" in text and "undefined_name_zb" in text and "agent" not in text


def test_syntax_error(agent: AgentProcess) -> None:
    frames = agent.execute("def (:")
    assert [f.type for f in frames] == [ERROR, DONE]
    assert done(frames)["ename"] == "SyntaxError"


def test_failing_formatter_fails_the_request(agent: AgentProcess) -> None:
    frames = agent.execute("class R:\n    def _repr_html_(self):\n        raise ValueError('bad html')\nR()")
    assert only(frames, ERROR)[0].payload["ename"] == "ValueError"
    assert "text/plain" in only(frames, RESULT)[0].payload["data"]  # the plain repr still shows
    reply = done(frames)
    assert (reply["status"], reply["ename"], reply["evalue"]) == ("error", "ValueError", "bad html")


def test_streams_keep_order_across_stdout_and_stderr(agent: AgentProcess) -> None:
    frames = agent.execute("import sys\nprint('a')\nprint('b', file=sys.stderr)\nprint('c')")
    streams = [(f.payload["name"], f.payload["text"]) for f in frames if f.type == STREAM]
    merged: list[tuple[str, str]] = []
    for name, text in streams:  # batching may join same-stream neighbours, never reorder
        if merged and merged[-1][0] == name:
            merged[-1] = (name, merged[-1][1] + text)
        else:
            merged.append((name, text))
    assert merged == [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c\n")]


def test_pending_stream_flushed_before_other_frames(agent: AgentProcess) -> None:
    frames = agent.execute("print('x', end='')\ndisplay(1)\nprint('y', end='')\n2")
    kinds = [(f.type, f.payload.get("text")) for f in frames if f.type in (STREAM, DISPLAY, RESULT, DONE)]
    assert kinds == [(STREAM, "x"), (DISPLAY, None), (STREAM, "y"), (RESULT, None), (DONE, None)]


def test_lines_stream_while_the_cell_runs(agent: AgentProcess) -> None:
    code = "import time\nfor i in range(5):\n    print(i)\n    time.sleep(0.2)"
    frames = agent.execute(code)
    assert stdout_text(frames) == "0\n1\n2\n3\n4\n"
    streams = only(frames, STREAM)
    assert frames.index(streams[0]) < len(frames) - 1
    # each line came out on its own, as it was printed
    assert len(streams) >= 4
    # the first line arrived long before the cell could have finished (4 more sleeps of 0.2 s)
    assert frames[-1].t - streams[0].t >= 0.6
    gaps = [b.t - a.t for a, b in zip(streams, streams[1:])]
    assert max(gaps) >= 0.1


def test_big_output_is_complete_and_batched(agent: AgentProcess) -> None:
    frames = agent.execute("for i in range(10000):\n    print(f'{i:07d}' + 'x' * 92)")
    text = stdout_text(frames)
    assert len(text) == 1_000_000
    assert text == "".join(f"{i:07d}" + "x" * 92 + "\n" for i in range(10000))
    assert len(only(frames, STREAM)) < 1000
    assert done(frames)["status"] == "ok"


def test_single_huge_write_is_split_below_frame_limit(agent: AgentProcess) -> None:
    frames = agent.execute("import sys; sys.stdout.write('\\u00e9' * (9 << 20))")
    text = stdout_text(frames)
    assert len(text) == 9 << 20 and set(text) == {"\u00e9"}
    assert len(only(frames, STREAM)) >= 2


def test_carriage_return_progress(agent: AgentProcess) -> None:
    code = "import time\nfor i in range(3):\n    print(f'\\r{i}', end='')\n    time.sleep(0.15)"
    frames = agent.execute(code)
    assert stdout_text(frames) == "\r0\r1\r2"
    streams = only(frames, STREAM)
    # a carriage return counts as a line end: each update goes out as it is written
    assert len(streams) == 3
    assert streams[-1].t - streams[0].t >= 0.2


def test_display_html(agent: AgentProcess) -> None:
    code = ("class H:\n    def _repr_html_(self):\n        return '<b>hi</b>'\n"
            "display(H())")
    frames = agent.execute(code)
    disp = only(frames, DISPLAY)
    assert len(disp) == 1
    assert disp[0].payload["data"]["text/html"] == "<b>hi</b>"
    assert "text/plain" in disp[0].payload["data"]
    assert disp[0].payload["update"] is False
    assert disp[0].payload["transient"] == {}
    assert done(frames)["status"] == "ok"


def test_update_display(agent: AgentProcess) -> None:
    code = ("from IPython.display import HTML\n"
            "h = display(HTML('<i>one</i>'), display_id=True)\n"
            "h.update(HTML('<i>two</i>'))")
    frames = agent.execute(code)
    first, second = only(frames, DISPLAY)
    display_id = first.payload["transient"]["display_id"]
    assert display_id
    assert first.payload["update"] is False
    assert second.payload["update"] is True
    assert second.payload["transient"]["display_id"] == display_id
    assert second.payload["data"]["text/html"] == "<i>two</i>"


def test_clear_output(agent: AgentProcess) -> None:
    frames = agent.execute("from IPython.display import clear_output\nprint('a')\nclear_output(wait=True)")
    assert [f.type for f in frames] == [STREAM, CLEAR_OUTPUT, DONE]
    assert frames[1].payload == {"wait": True}


def test_matplotlib_inline_png(agent: AgentProcess) -> None:
    frames = agent.execute("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]);")
    pngs = [f for f in only(frames, DISPLAY) if "image/png" in f.payload["data"]]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0].payload["data"]["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert frames.index(pngs[0]) < len(frames) - 1  # before DONE
    # the figure is closed after being shown: the next cell shows nothing
    assert [f.type for f in agent.execute("x = 1")] == [DONE]


def test_pandas_html(agent: AgentProcess) -> None:
    frames = agent.execute("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    result = only(frames, RESULT)[0].payload
    assert "<table" in result["data"]["text/html"]
    assert "a  b" in result["data"]["text/plain"]


def test_oversized_display_is_dropped_with_a_note(agent: AgentProcess) -> None:
    frames = agent.execute("display({'text/plain': 'x' * (17 << 20)}, raw=True)\nprint('after')")
    assert only(frames, DISPLAY) == []
    assert "dropped" in stdout_text(frames, "stderr")
    assert stdout_text(frames) == "after\n"
    assert done(frames)["status"] == "ok"


def test_user_expressions(agent: AgentProcess) -> None:
    reply = done(agent.execute("zb_a = 20", user_expressions={"double": "zb_a * 2", "bad": "1/0"}))
    exprs = reply["user_expressions"]
    assert exprs["double"]["status"] == "ok"
    assert exprs["double"]["data"]["text/plain"] == "40"
    assert exprs["bad"]["status"] == "error"
    assert exprs["bad"]["ename"] == "ZeroDivisionError"


def test_page_payload(agent: AgentProcess) -> None:
    frames = agent.execute("print?")
    reply = done(frames)
    assert reply["status"] == "ok"
    pages = [p for p in reply["payload"] if p.get("source") == "page"]
    assert len(pages) == 1
    assert pages[0]["start"] == 0
    assert "Docstring" in ANSI.sub("", pages[0]["data"]["text/plain"])
    # the payload does not stick to the next request
    assert done(agent.execute("1;"))["payload"] == []


def test_exit_and_systemexit_keep_agent_alive(agent: AgentProcess) -> None:
    reply = done(agent.execute("import sys\nsys.exit(3)"))
    assert reply["status"] == "error" and reply["ename"] == "SystemExit"
    reply = done(agent.execute("exit()"))
    assert reply["status"] == "ok"
    assert {"source": "ask_exit", "keepkernel": False} in reply["payload"]
    assert stdout_text(agent.execute("print('still here')")) == "still here\n"


# ---- input ------------------------------------------------------------------------------------

def test_input_round_trip(agent: AgentProcess) -> None:
    requests: list[Frame] = []

    def answer(frame: Frame) -> str:
        requests.append(frame)
        return "Ada"

    frames = agent.execute("print('before', end='')\nname = input('name? ')\nprint('hi', name)", on_input=answer)
    assert [r.payload for r in requests] == [{"prompt": "name? ", "password": False}]
    kinds = [f.type for f in frames]
    # pending text goes out before the request, so the prompt shows after it
    assert kinds.index(STREAM) < kinds.index(INPUT_REQUEST)
    assert stdout_text(frames) == "beforehi Ada\n"
    assert done(frames)["status"] == "ok"


def test_input_without_stdin_raises(agent: AgentProcess) -> None:
    frames = agent.execute("input('x')", allow_stdin=False)
    assert only(frames, INPUT_REQUEST) == []
    reply = done(frames)
    assert reply["status"] == "error"
    assert reply["ename"] == "StdinNotImplementedError"
    assert "agent" not in plain(reply["traceback"])


def test_getpass_requests_a_password(agent: AgentProcess) -> None:
    prompts: list[dict[str, Any]] = []
    frames = agent.execute("import getpass\nprint(len(getpass.getpass()))",
                           on_input=lambda f: prompts.append(f.payload) or "secret")
    assert prompts == [{"prompt": "Password: ", "password": True}]
    assert stdout_text(frames) == "6\n"


def test_input_eof(agent: AgentProcess) -> None:
    reply = done(agent.execute("input()", on_input=lambda f: "\x04"))
    assert reply["ename"] == "EOFError"


def test_stray_frames_are_ignored(agent: AgentProcess) -> None:
    agent.send(INPUT_REPLY, {"value": "nobody asked"})
    agent.send(77, {"what": "unknown"})
    assert stdout_text(agent.execute("print('ok')")) == "ok\n"
    assert "unknown frame type 77" in agent.agent_log()


def test_frame_split_across_writes(agent: AgentProcess) -> None:
    body = json.dumps({"id": 999, "code": "print('split')", "silent": False, "store_history": True,
                       "user_expressions": {}, "allow_stdin": False, "execution_count": 99,
                       "reseed": None}).encode()
    data = HEADER.pack(MAGIC, 1, EXECUTE, len(body)) + body
    agent.new_request()
    for i in range(0, len(data), 7):
        agent.send_raw(data[i:i + 7])
        time.sleep(0.001)
    frames = agent.until_done(999)
    assert stdout_text(frames) == "split\n"


# ---- completion and inspection ----------------------------------------------------------------

def test_complete(agent: AgentProcess) -> None:
    reply = agent.request(COMPLETE, COMPLETE_REPLY, code="import o", cursor_pos=8)
    assert reply["status"] == "ok"
    assert "os" in reply["matches"]
    assert (reply["cursor_start"], reply["cursor_end"]) == (7, 8)
    reply = agent.request(COMPLETE, COMPLETE_REPLY, code="x = 1\npri", cursor_pos=9)
    assert "print" in reply["matches"]
    assert (reply["cursor_start"], reply["cursor_end"]) == (6, 9)
    assert reply["metadata"] == {}


def test_complete_user_names(agent: AgentProcess) -> None:
    agent.execute("zb_completion_target = 1")
    reply = agent.request(COMPLETE, COMPLETE_REPLY, code="zb_completion_t", cursor_pos=15)
    assert reply["matches"] == ["zb_completion_target"]


def test_inspect(agent: AgentProcess) -> None:
    reply = agent.request(INSPECT, INSPECT_REPLY, code="print(", cursor_pos=3, detail_level=0)
    assert reply["status"] == "ok"
    assert reply["found"] is True
    text = ANSI.sub("", reply["data"]["text/plain"])
    assert "Docstring" in text and "print" in text
    reply = agent.request(INSPECT, INSPECT_REPLY, code="no_such_name_zb", cursor_pos=5, detail_level=1)
    assert reply["found"] is False
    assert reply["data"] == {}


# ---- randomness -------------------------------------------------------------------------------

def test_reseed(agent: AgentProcess) -> None:
    code = "import random, numpy\nprint(random.random(), numpy.random.rand())"

    def run(seed: str | None) -> tuple[str, str]:
        a, b = stdout_text(agent.execute(code, reseed=seed)).split()
        return a, b

    one, two = "00" * 16, "ab" * 16
    first = run(one)
    second = run(two)
    assert first[0] != second[0] and first[1] != second[1]
    assert run(one) == first  # same entropy, same numbers
    # without reseed the user's own seeding carries over to the next cell
    agent.execute("random.seed(42)")
    expected = random.Random(42).random()
    assert float(stdout_text(agent.execute("print(random.random())"))) == expected


# ---- interrupts -------------------------------------------------------------------------------

def _interrupt_when_started(proc: AgentProcess, code: str) -> list[Frame]:
    rid = proc.start_execute("print('started', flush=True)\n" + code)
    frames = [proc.recv()]
    assert frames[0].type == STREAM and frames[0].payload["text"].startswith("started"), frames[0]
    time.sleep(0.2)
    os.kill(proc.proc.pid, signal.SIGINT)
    frames += proc.until_done(rid)
    return frames


def test_keyboard_interrupt_busy_loop(agent: AgentProcess) -> None:
    frames = _interrupt_when_started(agent, "while True:\n    pass")
    errors = only(frames, ERROR)
    assert len(errors) == 1 and errors[0].payload["ename"] == "KeyboardInterrupt"
    reply = done(frames)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert stdout_text(agent.execute("print('after interrupt')")) == "after interrupt\n"


def test_keyboard_interrupt_while_printing(agent: AgentProcess) -> None:
    frames = _interrupt_when_started(agent, "while True:\n    print('spam ' * 20)")
    assert done(frames)["ename"] == "KeyboardInterrupt"
    assert stdout_text(agent.execute("print('after interrupt')")) == "after interrupt\n"


def test_keyboard_interrupt_sleep(agent: AgentProcess) -> None:
    frames = _interrupt_when_started(agent, "import time\ntime.sleep(60)")
    assert done(frames)["ename"] == "KeyboardInterrupt"
    assert frames[-1].t - frames[0].t < 30


def test_keyboard_interrupt_during_input(agent: AgentProcess) -> None:
    rid = agent.start_execute("input('wait: ')")
    request = agent.recv()
    assert request.type == INPUT_REQUEST
    time.sleep(0.1)
    os.kill(agent.proc.pid, signal.SIGINT)
    reply = done(agent.until_done(rid))
    assert reply["ename"] == "KeyboardInterrupt"
    assert "agent" not in plain(reply["traceback"])
    agent.send(INPUT_REPLY, {"value": "too late"})  # the host answered anyway: ignored
    assert stdout_text(agent.execute("print('after interrupt')")) == "after interrupt\n"


def _wait_until_reading(agent: AgentProcess, timeout: float = TIMEOUT) -> None:
    """Until the agent blocks in read() on its channel (as the VM's host waits before it pushes
    a request; /proc/PID/syscall starts with the number of the syscall it sleeps in, read = 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{agent.proc.pid}/syscall").read_text().split()[0] == "0":
                return
        except PermissionError:  # no ptrace access here: after READY it sleeps only in that read
            if Path(f"/proc/{agent.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S":
                return
        except (OSError, IndexError):
            pass
        time.sleep(0.01)
    raise TimeoutError("the agent never blocked reading its channel")


def test_interrupt_while_waiting_is_for_the_next_request(fresh_agent: AgentProcess) -> None:
    """The host raises SIGINT only for a request it has pushed (an interrupt when no cell runs is
    dropped before it reaches the guest), and it can land while the agent still waits for that
    request's bytes: the agent holds it and the request's code stops at its first line, without
    running; nothing of it reaches the agent's own code, and the next request is not affected."""
    _wait_until_reading(fresh_agent)
    os.kill(fresh_agent.proc.pid, signal.SIGINT)
    time.sleep(0.2)
    assert fresh_agent.proc.poll() is None
    frames = fresh_agent.execute("print('never')\nprint('runs')")
    assert stdout_text(frames) == ""
    reply = done(frames)
    assert reply["ename"] == "KeyboardInterrupt"
    assert "line 1" in plain(reply["traceback"]) and "agent" not in plain(reply["traceback"])
    assert stdout_text(fresh_agent.execute("print('fine')")) == "fine\n"


def test_interrupt_in_ipython_machinery_waits_for_user_code(agent: AgentProcess) -> None:
    """An interrupt that lands while IPython prepares a cell (events, history, compilation) is
    held and raised where the cell's code starts, never in IPython's own callbacks (which would
    print "Error in callback" and swallow it)."""
    agent.execute("import sys\n"
                  "def _hold_interrupt(info):  # once: as if a SIGINT landed in IPython's callbacks\n"
                  "    sys.stdout._channel.gate.pending = True\n"
                  "    get_ipython().events.unregister('pre_run_cell', _hold_interrupt)\n"
                  "get_ipython().events.register('pre_run_cell', _hold_interrupt)")
    frames = agent.execute("x = 'body ran'\nprint(x)")
    reply = done(frames)
    assert reply["ename"] == "KeyboardInterrupt" and stdout_text(frames) == ""
    assert "Error in callback" not in stdout_text(frames) + stdout_text(frames, "stderr")
    assert stdout_text(agent.execute("print('after')")) == "after\n"


def test_interrupt_reaches_the_line_after_a_held_one(agent: AgentProcess) -> None:
    """Held between two statements of a cell (in IPython's machinery), an interrupt is raised at
    the next statement's line: the first statement's effects stay, the next does not run."""
    frames = agent.execute("import sys\nprint('first')\nsys.stdout._channel.gate.pending = True\n"
                           "print('second')")
    # the pending flag is set in user code: the gate raises it at the next run_code (statement)
    reply = done(frames)
    assert stdout_text(frames) == "first\n"
    assert reply["ename"] == "KeyboardInterrupt"
    assert "----> 4" in plain(reply["traceback"]).replace("\x1b", "") or "line 4" in plain(reply["traceback"])


def test_output_threads_print_between_requests_goes_out_as_it_comes(agent: AgentProcess) -> None:
    """Threads run between cells (issue 14): each line they print then goes out at once, in STREAM
    frames numbered `idle` (not `seq`), while the agent waits for its next request; a line not
    completed yet goes out first with the next request."""
    agent.execute("import threading, sys, time\n"
                  "go = threading.Event()\n"
                  "def talk():\n"
                  "    go.wait()\n"
                  "    for i in range(3):\n"
                  "        print('tick', i)\n"
                  "        time.sleep(0.05)\n"
                  "    sys.stderr.write('err line\\n')\n"
                  "    sys.stdout.write('partial')\n"
                  "t = threading.Thread(target=talk); t.start()")
    agent.execute("go.set()")  # the thread prints after this reply, while no request runs
    agent.wait_idle_output(lambda: ("stderr", "err line\n") in agent.idle_output)
    assert agent.idle_output == [("stdout", "tick 0\n"), ("stdout", "tick 1\n"), ("stdout", "tick 2\n"),
                                 ("stderr", "err line\n")]
    frames = agent.execute("t.join(); print('next')")
    assert stdout_text(frames) == "partialnext\n"  # the unfinished line is the next request's
    assert len(agent.idle_output) == 4  # nothing more went out between the requests
