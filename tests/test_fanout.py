"""%%fanout NAME in EXPR (zeroboot_kernel/fanout.py): one fork of the live state per value."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from session_helpers import cell
from zeroboot_kernel import engine_requests as req
from zeroboot_kernel import fanout, fanout_jobs
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
    for code in ("%%fanout in [1]\nx", "%%fanout x [1]\nx", "%%fanout x in [1]\n", "%%fanout x in [1] --jobs 0\nx",
                 "%%fanout x in [1] --jobs -2\nx", "%%fanout x in [1] --jobs two\nx", "%%fanout x in [1] --jobs\nx",
                 "%%fanout x in [1] --jobs 1.5\nx"):
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


def interrupted_once_started(km, kc, header: str) -> tuple[str, list]:
    """Run header's fan-out of a 60 s sleep; interrupt the kernel once the first value has started;
    (the request's id, its IOPub messages)."""
    import time

    from kernel_helpers import collect, stream_text
    msg_id = kc.execute(f"{header}\nimport time\nprint('started', v, flush=True)\ntime.sleep(60)")
    deadline = time.monotonic() + 120
    seen: list = []
    while "started 1" not in stream_text(seen):
        assert time.monotonic() < deadline, "the first run did not start"
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id:
            seen.append(msg)
    km.interrupt_kernel()
    return msg_id, seen + collect(kc, msg_id)


def test_an_interrupt_reaches_the_running_fork_and_ends_the_fanout() -> None:
    from kernel_helpers import kernel, shell_reply, stream_text, value_of
    with kernel() as (km, kc):
        msg_id, msgs = interrupted_once_started(km, kc, "%%fanout v in [1, 2, 3]")
        assert shell_reply(kc, msg_id)["content"]["status"] == "ok"
        assert "interrupted; the values after it were not run" in stream_text(msgs, "stderr")
        assert "started 2" not in stream_text(msgs)
        assert value_of(kc, "_fanout") == "[None]"


def test_a_value_that_ignores_the_interrupt_is_stopped_and_ends_the_fanout(session) -> None:
    """A value that ignores SIGINT is stopped when the interrupt's grace runs out (SandboxTimeout
    after_interrupt): that too ends the fan-out, as an honoured interrupt does."""
    code = ("%%fanout v in [1, 2, 3]\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "print('started', v, flush=True)\ntime.sleep(60)")
    out: list[str] = []

    def on_stream(name: str, text: str) -> None:
        out.append(text)
        if "started 1" in text:
            session.running_fork.interrupt()
    reply = fanout.run(session, code, execution_count=2, on_stream=on_stream, on_message=None)
    text = "".join(out)
    assert reply["status"] == "ok", reply
    assert "[0] v: interrupted (the cell did not stop within" in text and "started 2" not in text, text
    assert cell(session, "_fanout")["result"] == "[None]"


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
        for jobs in (0, -1, 1.5):
            with pytest.raises(ValueError, match="jobs is a whole number"):
                sb.fanout("x", [{}], jobs=jobs)  # type: ignore[arg-type]
        with pytest.raises(fanout.SandboxError, match="not implemented"):
            sb.fanout("x", [{}], jobs=2)
        assert [r.result["text/plain"] for r in sb.fanout("base", [{}], jobs=1)] == ["10"]


def test_an_unpicklable_result_is_none_with_a_note(session) -> None:
    reply, out, err, msgs = fan(session, "%%fanout v in [1, 2]\n(lambda: v) if v == 1 else v")
    assert reply["status"] == "ok" and "[0]: the result cannot be kept in _fanout" in err, err
    assert cell(session, "_fanout", 3)["result"] == "[None, 2]"


# ---- --jobs N: worker engine processes (zeroboot_kernel/fanout_jobs.py) ----------------------

def test_jobs_parsing_shares_and_the_cap(monkeypatch) -> None:
    from zeroboot_kernel import fanout_jobs
    assert fanout.parse_all("%%fanout lr in [1, 2] --jobs 3\nlr") == ("lr", "[1, 2]", "lr", 3)
    assert fanout.parse_all("%%fanout lr in range(4) --jobs=2\nlr")[3] == 2
    assert fanout.parse_all("%%fanout lr in [x for x in 'ab']\nlr")[1:] == ("[x for x in 'ab']", "lr", 1)
    assert fanout.jobs_of("%%fanout x in [1] --jobs 0\nx") == 1  # the engine reports the usage error
    for bad in ("0", "-1", "+-1", "1e3", "２"):
        with pytest.raises(fanout.SandboxError, match="whole number"):
            fanout.parse_jobs(bad)
    assert fanout_jobs.shares(5, 2) == [(0, 3), (3, 5)]
    assert fanout_jobs.shares(1, 4) == [(0, 1)] and fanout_jobs.shares(0, 2) == []
    assert fanout_jobs.shares(50, 3) == [(0, 17), (17, 34), (34, 50)]
    monkeypatch.setenv("ZEROBOOT_FANOUT_JOBS", "3")
    assert fanout.max_jobs() == 3
    monkeypatch.setenv("ZEROBOOT_FANOUT_JOBS", "nonsense")
    assert fanout.max_jobs() >= 1


def test_jobs_in_process_is_noted_and_runs_one_after_another(session) -> None:
    reply, out, err, _ = fan(session, "%%fanout v in [1, 2] --jobs 2\nv * 5")
    assert reply["status"] == "ok" and "no worker engines here" in err, err
    assert cell(session, "_fanout", 3)["result"] == "[5, 10]"


class _Workers:
    """make_worker for FanoutJobs that keeps every worker it starts; `kill` kills the worker of that
    start number as soon as it is up (before it resumes the save)."""

    def __init__(self, project: str, kill: int | None = None) -> None:
        self.project, self.kill, self.started, self.base_modes = project, kill, [], []

    def __call__(self):
        import glob
        import os

        from zeroboot_kernel.engine_client import EngineClient
        for f in glob.glob(os.path.join(os.environ["TMPDIR"], "zeroboot-fanout-*", "base.zbsave")):
            self.base_modes.append((os.stat(os.path.dirname(f)).st_mode & 0o777, os.stat(f).st_mode & 0o777))
        w = EngineClient(project=self.project)
        self.started.append(w)
        if self.kill == len(self.started):
            w.proc.kill()
            w.proc.wait()
        return w


def _engine_fanout(client, code: str, count: int, workers: _Workers | None = None) -> tuple[str, list, str, str]:
    """(stream text, error events' enames, the reply's status, _fanout) of the cell through the
    engine process (jobs 1) or FanoutJobs (workers given)."""
    from zeroboot_kernel import engine_requests as req
    from zeroboot_kernel import fanout_jobs
    if workers is None:
        events = list(client.request(req.EXECUTE, code=code, execution_count=count))
    else:
        events = list(fanout_jobs.FanoutJobs(client, workers).run(code, count, fanout.jobs_of(code)))
    text = "".join(e["text"] for e in events if e["event"] == "stream")
    errors = [e["content"]["ename"] for e in events if e["event"] == "error"]
    got = client.call(req.EXECUTE, code="None", execution_count=count + 1,
                      user_expressions={"r": "repr((globals().get('_fanout'), 'v' in globals(), k))"})
    return text, errors, events[-1]["content"]["status"], got["user_expressions"]["r"]["data"]["text/plain"]


@pytest.fixture
def engine(tmp_path, monkeypatch):
    import tempfile

    from zeroboot_kernel import engine_requests as req
    from zeroboot_kernel.engine_client import EngineClient
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("ZEROBOOT_SAVE_DIR", str(tmp_path / "saves"))
    monkeypatch.setenv("ZEROBOOT_FANOUT_JOBS", "2")
    project = tmp_path / "project"
    project.mkdir()
    client = EngineClient(project=str(project), timeout=4)
    try:
        assert client.call(req.EXECUTE, code="k = 3", execution_count=1)["status"] == "ok"
        yield client, str(project), tmp
    finally:
        client.close()


MIXED = ("%%fanout v in [1, 2, 3, 4, 5]{jobs}\nimport ctypes, time\nprint('run', v)\n"
         "if v == 2: ctypes.string_at(0)\nif v == 3: 1 / 0\nif v == 4: time.sleep(60)\nk * v")


def _no_pid_left(workers: _Workers) -> None:
    assert workers.started and all(w.proc.poll() is not None for w in workers.started)


def test_jobs_2_gives_what_jobs_1_gives_with_an_error_a_crash_and_a_timeout(engine) -> None:
    client, project, tmp = engine
    one = _engine_fanout(client, MIXED.format(jobs=""), 2)
    workers = _Workers(project)
    two = _engine_fanout(client, MIXED.format(jobs=" --jobs 2"), 4, workers)
    assert one[2] == two[2] == "ok"
    assert one[3] == two[3] == "'([3, None, None, None, 15], False, 3)'", (one, two)
    assert one[1] == two[1] == ["ZeroDivisionError"]
    # the same labels, outputs and per-value reports, in the order of the values
    assert one[0] == two[0], (one[0], two[0])
    assert "[1] v: SandboxCrashed" in two[0] and "[3] v: SandboxTimeout" in two[0], two[0]
    assert len(workers.started) == 2
    assert workers.base_modes and all(m == (0o700, 0o600) for m in workers.base_modes), workers.base_modes
    _no_pid_left(workers)
    assert list(tmp.iterdir()) == []  # the save and its folder are gone


def test_jobs_above_the_cap_are_capped_with_a_note(engine) -> None:
    client, project, tmp = engine
    workers = _Workers(project)
    text, errors, status, result = _engine_fanout(client, "%%fanout v in range(6) --jobs 64\nk + v", 2, workers)
    assert status == "ok" and "capped at 2 workers" in text, text
    assert result == "'([3, 4, 5, 6, 7, 8], False, 3)'"
    assert len(workers.started) == 2
    _no_pid_left(workers)


def test_a_dead_worker_costs_only_its_values(engine) -> None:
    client, project, tmp = engine
    workers = _Workers(project, kill=2)  # the second worker dies before it resumes the save
    text, errors, status, result = _engine_fanout(client, "%%fanout v in [1, 2, 3, 4] --jobs 2\nk * v", 2, workers)
    # which share the second worker to start serves is up to the threads: either way, only its values
    shares = {"'([3, 6, None, None], False, 3)'": ("[2] to [3]", "v [2], [3]"),
              "'([None, None, 9, 12], False, 3)'": ("[0] to [1]", "v [0], [1]")}
    assert status == "ok" and result in shares, (text, result)
    failed, missing = shares[result]
    assert f"the worker for values {failed} failed" in text, text
    assert f"2 values did not run (or did not report): {missing}" in text, text
    _no_pid_left(workers)
    assert list(tmp.iterdir()) == []


class _GatedWorkers(_Workers):
    """make_worker whose workers hold the execute request of every share but the first until
    `gate` is set: an interrupt can come while such a worker is about to start its share."""

    def __init__(self, project: str) -> None:
        super().__init__(project)
        self.gate = threading.Event()

    def __call__(self):
        w = super().__call__()
        request, gate = w.request, self.gate

        def gated(op, **fields):
            if op == req.EXECUTE and fields.get("fanout_share", [0])[0] > 0:
                assert gate.wait(120), "the test never opened the gate"
            yield from request(op, **fields)
        w.request = gated
        return w


def test_an_interrupt_while_a_worker_starts_its_share_stops_that_share(engine) -> None:
    """The interrupt comes after the second worker checked for one and before its execute request
    is out (its engine would drop an interrupt naming another request): that share still stops,
    and no value after an interrupted one runs (without the fix values 3 and 4 would run, each
    until the cell timeout).
    Its own engine with a timeout far above a loaded host's delays: the fixture's 4 s could end
    value 1 before the interrupt reaches it, and value 2 would start."""
    from zeroboot_kernel.engine_client import EngineClient
    _, project, tmp = engine
    client = EngineClient(project=project, timeout=90)
    workers = _GatedWorkers(project)
    jobs = fanout_jobs.FanoutJobs(client, workers)
    code = "%%fanout v in [1, 2, 3, 4] --jobs 2\nimport time\nprint('started', v, flush=True)\ntime.sleep(60)"
    events, text = [], ""
    try:
        for ev in jobs.run(code, 2, 2):
            events.append(ev)
            text += ev.get("text", "")
            if "started 1" in text and not workers.gate.is_set():
                jobs.interrupt()
                workers.gate.set()
    finally:
        client.close()
    assert events[-1]["content"]["status"] == "ok", events[-1]
    # value 1 is interrupted (on a loaded host perhaps only at the end of the grace); the second
    # share either never starts or is interrupted in its first value (its execute went out just
    # after the interrupt): no value after an interrupted one runs
    assert "[0] v: interrupted" in text and "started 2" not in text and "started 4" not in text, text
    assert "[2] v: interrupted" in text or "started 3" not in text, text
    assert "%%fanout (interrupted):" in text, text
    _no_pid_left(workers)
    assert list(tmp.iterdir()) == []


def test_a_bad_expr_with_jobs_is_an_error_and_starts_no_worker(engine) -> None:
    client, project, tmp = engine
    workers = _Workers(project)
    text, errors, status, result = _engine_fanout(client, "%%fanout v in undefined_name --jobs 2\nv", 2, workers)
    assert status == "error" and errors == ["NameError"] and workers.started == [], (text, errors)
    assert result == "'(None, False, 3)'"
    one = _engine_fanout(client, "%%fanout v in undefined_name\nv", 4)
    assert one[1:] == (errors, status, result)


def test_jobs_through_the_kernel_and_an_interrupt_stops_every_worker(tmp_path) -> None:
    from kernel_helpers import execute, kernel, shell_reply, stream_text, value_of
    with kernel(ZEROBOOT_FANOUT_JOBS="2", ZEROBOOT_SAVE_DIR=str(tmp_path / "saves"), TMPDIR=str(tmp_path)) as (km, kc):
        execute(kc, "k = 3")
        reply, msgs = execute(kc, "%%fanout lr in [1, 2, 3] --jobs 2\nk * lr")
        assert reply["status"] == "ok", reply
        assert [m["content"]["data"]["text/plain"] for m in msgs if m["msg_type"] == "execute_result"] == ["3", "6", "9"]
        assert value_of(kc, "(_fanout, 'lr' in globals())") == "([3, 6, 9], False)"
        msg_id, msgs = interrupted_once_started(km, kc, "%%fanout v in [1, 2, 3, 4] --jobs 2")
        assert shell_reply(kc, msg_id)["content"]["status"] == "ok"
        err = stream_text(msgs, "stderr")
        assert "[0] v: interrupted" in err and "did not run" in err and "[1]" in err, err
        assert "started 2" not in stream_text(msgs)
        assert value_of(kc, "_fanout") == "[None, None, None, None]"
        assert not list(tmp_path.glob("zeroboot-fanout-*"))
        kernel_pid = km.provisioner.process.pid
        children = [c for task in Path(f"/proc/{kernel_pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
        assert len(children) == 1, children  # the kernel's own engine only: no worker is left


def test_a_live_child_process_cannot_be_handed_to_workers(engine) -> None:
    from zeroboot_kernel import engine_requests as req
    client, project, tmp = engine
    got = client.call(req.EXECUTE, code="import subprocess\np = subprocess.Popen(['sleep', '30'])", execution_count=2)
    assert got["status"] == "ok", got
    workers = _Workers(project)
    text, errors, status, result = _engine_fanout(client, "%%fanout v in [1, 2] --jobs 2\nv", 3, workers)
    assert status == "error" and workers.started == [], (text, errors)
    events = list(fanout_jobs_run(client, "%%fanout v in [1, 2] --jobs 2\nv", workers))
    assert "child processes (pids" in events[-1]["content"]["evalue"], events[-1]
    assert list(tmp.iterdir()) == []
    client.call(req.EXECUTE, code="p.kill(); p.wait()", execution_count=5)


def fanout_jobs_run(client, code: str, workers: _Workers):
    from zeroboot_kernel import fanout_jobs
    return fanout_jobs.FanoutJobs(client, workers).run(code, 4, 2)
