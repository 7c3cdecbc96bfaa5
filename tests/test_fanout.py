"""%%fanout NAME in EXPR (zeroboot_kernel/fanout.py): one fork of the live state per value."""
from __future__ import annotations

import pytest

from session_helpers import cell
from zeroboot_kernel import fanout
from zeroboot_kernel.session import Session


@pytest.fixture
def session(template):
    s = Session(template, timeout=20)
    yield s
    s.close()


def fan(s: Session, code: str, n: int = 2) -> tuple[dict, str, str, list]:
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    msgs: list = []
    reply = fanout.run(s, code, execution_count=n, on_stream=lambda name, t: out[name].append(t),
                       on_message=lambda mt, c: msgs.append((mt, c)))
    return reply, "".join(out["stdout"]), "".join(out["stderr"]), msgs


def test_three_values_results_and_live_state_unchanged(session) -> None:
    cell(session, "base = 10\nseen = []", 1)
    reply, out, err, msgs = fan(session, "%%fanout lr in [0.1, 0.01, 0.001]\nseen.append(lr)\nprint('run', lr)\nbase * lr")
    assert reply["status"] == "ok", (reply, err)
    assert out.count("── [") == 3 and "run 0.01" in out and "lr = 0.001" in out
    assert [c["data"]["text/plain"] for mt, c in msgs if mt == "execute_result"] == ["1.0", "0.1", "0.01"]
    assert cell(session, "(_fanout, seen, 'lr' in globals())", 3)["result"] == "([1.0, 0.1, 0.01], [], False)"


def test_a_crashing_and_a_timing_out_value_are_reported_alone(session) -> None:
    session.timeout = 3
    code = ("%%fanout v in [1, 2, 3]\nimport ctypes, time\n"
            "if v == 2: ctypes.string_at(0)\nif v == 3: time.sleep(60)\nv * 100")
    reply, out, err, _ = fan(session, code)
    assert reply["status"] == "ok"
    assert "[1] v: SandboxCrashed" in err and "[2] v: SandboxTimeout" in err, err
    assert cell(session, "_fanout", 3)["result"] == "[100, None, None]"


def test_fifty_values_and_an_error_in_one(session) -> None:
    reply, out, err, msgs = fan(session, "%%fanout i in range(50)\n1 / (i - 7)")
    assert reply["status"] == "ok"
    assert out.count("── [") == 50
    assert [mt for mt, _ in msgs].count("error") == 1
    r = cell(session, "(len(_fanout), _fanout[7], _fanout[8])", 3)["result"]
    assert r == "(50, None, 1.0)"


def test_bad_headers_and_a_failing_expr(session) -> None:
    for code in ("%%fanout in [1]\nx", "%%fanout x [1]\nx", "%%fanout x in [1]\n", "%%fanout x in [1] --jobs 4\nx"):
        reply, *_ = fan(session, code)
        assert reply["status"] == "error" and "%%fanout" in reply["evalue"], code
    reply, *_ = fan(session, "%%fanout x in undefined_name\nx")
    assert reply["status"] == "error" and "EXPR failed" in reply["evalue"]


def test_fanout_through_the_kernel() -> None:
    from kernel_helpers import execute, kernel, stream_text, value_of
    with kernel() as (_, kc):
        execute(kc, "k = 3")
        reply, msgs = execute(kc, "%%fanout lr in [1, 2]\nk * lr")
        assert reply["status"] == "ok", reply
        assert "lr = 1" in stream_text(msgs) and "lr = 2" in stream_text(msgs)
        assert [m["content"]["data"]["text/plain"] for m in msgs if m["msg_type"] == "execute_result"] == ["3", "6"]
        assert value_of(kc, "(_fanout, 'lr' in globals())") == "([3, 6], False)"


def test_an_interrupt_reaches_the_running_fork_and_ends_the_fanout() -> None:
    import time

    from kernel_helpers import collect, kernel, shell_reply, stream_text, value_of
    with kernel() as (km, kc):
        msg_id = kc.execute("%%fanout v in [1, 2, 3]\nimport time\nprint('started', v, flush=True)\ntime.sleep(60)")
        deadline = time.monotonic() + 60
        seen: list = []
        while "started 1" not in stream_text(seen):
            assert time.monotonic() < deadline, "the first run did not start"
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == msg_id:
                seen.append(msg)
        km.interrupt_kernel()
        msgs = seen + collect(kc, msg_id)
        assert shell_reply(kc, msg_id)["content"]["status"] == "ok"
        assert "interrupted; the values after it were not run" in stream_text(msgs, "stderr")
        assert "started 2" not in stream_text(msgs)
        assert value_of(kc, "_fanout") == "[None]"


def test_the_python_api(template) -> None:
    with template.fork() as sb:
        sb.execute("base = 10")
        runs = sb.fanout("print(base * lr)\nbase * lr", [{"lr": 0.5}, {"lr": 2}, {"lr": 3}])
        assert [r.stdout.strip() for r in runs] == ["5.0", "20", "30"]
        assert [r.result["text/plain"] for r in runs] == ["5.0", "20", "30"]
        crashed = sb.fanout("import ctypes\nctypes.string_at(0)", [{}])
        assert type(crashed[0]).__name__ == "SandboxCrashed"
        assert sb.execute("'lr' in globals(), base").result["text/plain"] == "(False, 10)"
        with pytest.raises(ValueError):
            sb.fanout("x", [{"not a name": 1}])


def test_an_unpicklable_result_is_none_with_a_note(session) -> None:
    reply, out, err, msgs = fan(session, "%%fanout v in [1, 2]\n(lambda: v) if v == 1 else v")
    assert reply["status"] == "ok" and "[0]: the result cannot be kept in _fanout" in err, err
    assert cell(session, "_fanout", 3)["result"] == "[None, 2]"
