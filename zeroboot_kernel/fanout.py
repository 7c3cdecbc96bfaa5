"""`%%fanout NAME in EXPR`: run a cell once per value of EXPR, each in its own fork of the live state.

The engine server sends a cell that starts with `%%fanout` here instead of to Session.execute (the
cell is the user's code, as the kernel sent it). EXPR is evaluated once, in a fork of the live
state; that fork's state (with the values) is snapshotted and every value's run is a fork of it,
with NAME bound, so no run sees another's changes and the live state is not changed by them. Each
run's output goes out as the cell's, after a label line; an error, crash or timeout of one run is
reported for that value and the others go on. The runs' results (the value of the body's last
expression, pickled in the fork) become `_fanout` in the live state, through one ordinary cell, so
that `%rewind` undoes it like any cell. An interrupt reaches the running fork and ends the fan-out.
In one engine process the runs go one after another (it has one vCPU). `--jobs N` (N > 1) runs them
in N worker engine processes, which the kernel starts (fanout_jobs.py): this module's `base` gives
the kernel a delta save of the values' fork, and `run(share=...)` runs a worker's share of the values
in a worker that resumed it. Where no kernel starts workers (this module called in-process, a batch
run), `--jobs` is noted and the runs go one after another.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Any, Callable, TYPE_CHECKING

from .errors import SandboxError, SandboxTimeout

if TYPE_CHECKING:  # the kernel process parses %%fanout headers without the engine (native library)
    from .sandbox import Sandbox

log = logging.getLogger("zeroboot_kernel.fanout")

HEADER = re.compile(r"%%fanout[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+in[ \t]+(\S.*?)[ \t]*")
JOBS = re.compile(r"(.*?)[ \t]+--jobs(?:[ \t]*=[ \t]*|[ \t]+)(\S+)")
MAX_VALUES = 1000
MAX_RESULT_BYTES = 64 << 20      # of pickled results, all runs together
B64 = re.compile(r"[A-Za-z0-9+/=]*")
VALUES = "__zeroboot_fanout_values"
# the run's result (IPython's `_`, the body's last expression), pickled, as base64 text
PICKLED = "__import__('base64').b64encode(__import__('pickle').dumps(_)).decode()"


def _pickled_text(user_expressions: Any) -> str | None:
    """The base64 text of the PICKLED user expression's reply (guest output: checked), or None."""
    got = user_expressions.get("r") if isinstance(user_expressions, dict) else None
    data = got.get("data") if isinstance(got, dict) and got.get("status") == "ok" else None
    text = data.get("text/plain") if isinstance(data, dict) else None
    if not isinstance(text, str) or len(text) < 2 or text[0] != text[-1] or text[0] not in "'\"":
        return None
    text = text[1:-1]
    return text if B64.fullmatch(text) else None


def is_fanout(code: str) -> bool:
    return code.lstrip().startswith("%%fanout")


def max_jobs() -> int:
    """The most workers a fan-out gets: $ZEROBOOT_FANOUT_JOBS, else the host's CPU count."""
    env = os.environ.get("ZEROBOOT_FANOUT_JOBS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def parse_jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1 or str(jobs) != text.lstrip("+"):
        raise SandboxError(f"%%fanout --jobs takes a whole number of workers, 1 or more, not {text[:40]!r}")
    return jobs


def parse_all(code: str) -> tuple[str, str, str, int]:
    """(NAME, EXPR, body, jobs asked for) of a %%fanout cell, or SandboxError saying how to write it."""
    first, _, body = code.lstrip().partition("\n")
    first, jobs = first.rstrip(), 1
    jm = JOBS.fullmatch(first)
    if jm:
        first, jobs = jm.group(1), parse_jobs(jm.group(2))
    elif re.search(r"[ \t]--jobs\b", first):
        raise SandboxError("%%fanout --jobs needs a number of workers: `%%fanout NAME in EXPR --jobs N`")
    m = HEADER.fullmatch(first)
    if not m:
        raise SandboxError("usage: %%fanout NAME in EXPR [--jobs N] (the first line of the cell), then the cell's "
                           "body; for example `%%fanout lr in [0.1, 0.01]`")
    if not body.strip():
        raise SandboxError("%%fanout needs a cell body to run for each value")
    return m.group(1), m.group(2), body, jobs


def parse(code: str) -> tuple[str, str, str]:
    """(NAME, EXPR, body) of a %%fanout cell, or SandboxError saying how to write it."""
    name, expr, body, _ = parse_all(code)
    return name, expr, body


def jobs_of(code: str) -> int:
    """The --jobs a %%fanout cell asks for (1 when it does not, or when its header is malformed:
    the engine then reports the usage error)."""
    try:
        return parse_all(code)[3]
    except SandboxError:
        return 1


def _quiet(sb: Sandbox, code: str, timeout: float | None) -> tuple[str, Any]:
    out: list[str] = []
    r = sb.execute(code, store_history=False, timeout=timeout,
                   on_stream=lambda name, text: out.append(text) if name == "stdout" else None)
    return "".join(out), r


class Failed(Exception):
    """A fan-out that cannot start: the error (ename, evalue) its cell reports."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename, self.evalue = ename, evalue


def _values(session: Any, expr: str) -> tuple[int, Any]:
    """EXPR's values in a fork of the live state: (how many, a snapshot of that fork holding them as
    VALUES, which the caller releases); Failed says why not."""
    from .sandbox import Sandbox

    base, owned = session.snapshot_for_save()
    try:
        values_fork = Sandbox(base.fork(), session.template, fresh=False)
    finally:
        if owned:
            base.release()
    session.running_fork = values_fork
    try:
        text, r = _quiet(values_fork, f"{VALUES} = list({expr})\nprint(len({VALUES}))", session.timeout)
        if r.status != "ok":
            err = r.error or {}
            raise Failed(str(err.get("ename", "Error")), f"%%fanout: EXPR failed: {err.get('evalue', '')}")
        count = int(text.strip()) if text.strip().isdigit() else -1
        if not 0 <= count <= MAX_VALUES:
            raise Failed("ValueError", f"%%fanout runs 0 to {MAX_VALUES} values, not {text.strip()[:40]!r}")
        return count, values_fork.snapshot()
    except SandboxError as exc:
        raise Failed(type(exc).__name__, f"%%fanout: EXPR failed: {exc}") from None
    finally:
        session.running_fork = None
        values_fork.close()


def base(session: Any, code: str, key: bytes) -> tuple[bytes, int]:
    """For the kernel's workers (--jobs): EXPR's values in a fork of the live state, as a delta save
    (session_save's file format, signed with the user's save key) that a worker engine resumes;
    (the save's bytes, how many values). Failed (a usage error, EXPR's error) says why not."""
    from . import session_save
    try:
        expr = parse_all(code)[1]
    except SandboxError as exc:
        raise Failed("UsageError", str(exc)) from None
    count, values = _values(session, expr)
    try:
        data, _ = session_save.capture(session, key, "fanout", snap=values)
    finally:
        values.release()
    return data, count


def listing_code(results: list[str | None]) -> str:
    """The cell that sets _fanout from the runs' pickled results (base64 text, checked, or None)."""
    listing = ", ".join("None" if b is None else f"_zp.loads(_zb.b64decode({b!r}))" for b in results)
    return f"import pickle as _zp, base64 as _zb\n_fanout = [{listing}]\ndel _zp, _zb"


def run(session: Any, code: str, *, execution_count: int, on_stream: Callable[[str, str], None] | None,
        on_message: Callable[[str, dict[str, Any]], None] | None,
        poll: Callable[[], None] | None = None, share: tuple[int, int] | None = None) -> dict[str, Any]:
    """Run the %%fanout cell; the execute_reply content. While a run goes on, session.running_fork
    is its Sandbox, which an interrupt reaches (engine_server.interrupt); an interrupted run
    ends the fan-out (the values after it are not run).

    share=(first, stop): a worker engine's part of a --jobs fan-out (fanout_jobs.py): the live
    state is a resumed `base` save, which holds the values; values first..stop-1 run, labelled with
    their own index, and the reply's `fanout_results` gives their pickled results (base64 text or
    None, one for each value that ran) instead of setting _fanout."""
    def say(name: str, text: str) -> None:
        if on_stream:
            on_stream(name, text)

    try:
        name, expr, body, jobs = parse_all(code)
    except SandboxError as exc:
        return _error(execution_count, "UsageError", str(exc), on_message)
    if share is None:
        if jobs > 1:
            say("stderr", "%%fanout --jobs: no worker engines here (the kernel starts them); the runs go one "
                          "after another\n")
        try:
            count, values = _values(session, expr)
        except Failed as exc:
            return _error(execution_count, exc.ename, exc.evalue, on_message)
        indices, owned = range(count), True
    else:
        first, stop = share
        if not 0 <= first <= stop <= MAX_VALUES:
            return _error(execution_count, "ValueError", f"%%fanout: bad share {share!r}", on_message)
        values, owned = session.snapshot_for_save()  # not owned: isolated mode's, kept by the session
        indices = range(first, stop)
    from .sandbox import Sandbox

    results: list[str | None] = []
    total = 0
    try:
        for i in indices:
            child = Sandbox(values.fork(), session.template, fresh=False)
            session.running_fork = child
            try:
                label, r = _quiet(child, f"{name} = {VALUES}[{i}]\ndel {VALUES}\n"
                                  f"print(f'[{i}] {name} = {{{name}!r:.100}}')", session.timeout)
                say("stdout", f"── {label.strip()[:200]} ──\n")
                # the result comes back with the body's own reply (a user expression, evaluated
                # after the cell), not by another round trip
                r = child.execute(body, on_stream=on_stream, on_message=on_message, timeout=session.timeout,
                                  execution_count=execution_count, poll=poll, user_expressions={"r": PICKLED})
                if r.interrupted:
                    say("stderr", f"[{i}] {name}: interrupted; the values after it were not run\n")
                    results.append(None)
                    break
                if r.status != "ok" or r.result is None:
                    results.append(None)
                    continue
                pickled = _pickled_text(r.reply.get("user_expressions"))
                if pickled is None or total + len(pickled) > MAX_RESULT_BYTES:
                    say("stderr", f"[{i}]: the result cannot be kept in _fanout (not picklable, or too large): None\n")
                    results.append(None)
                    continue
                total += len(pickled)
                results.append(pickled)
            except SandboxTimeout as exc:
                if exc.after_interrupt:  # interrupted, and stopped after the grace: ends the fan-out too
                    say("stderr", f"[{i}] {name}: interrupted ({exc}); the values after it were not run\n")
                    results.append(None)
                    break
                say("stderr", f"[{i}] {name}: {type(exc).__name__}: {exc}\n")  # this run's time limit
                results.append(None)
            except SandboxError as exc:  # a crash, timeout or memory error of this run only
                say("stderr", f"[{i}] {name}: {type(exc).__name__}: {exc}\n")
                results.append(None)
            finally:
                session.running_fork = None
                child.close()
    finally:
        if owned:
            values.release()
    if share is not None:
        return {"status": "ok", "execution_count": execution_count, "user_expressions": {}, "payload": [],
                "fanout_results": results}
    reply = session.execute(listing_code(results), execution_count=execution_count, silent=True, store_history=False)
    if reply.get("status") != "ok":
        say("stderr", f"_fanout could not be set: {reply.get('evalue')}\n")
    return {"status": "ok", "execution_count": execution_count, "user_expressions": {}, "payload": []}


def _error(count: int, ename: str, evalue: str, on_message: Callable[[str, dict[str, Any]], None] | None) -> dict[str, Any]:
    content = {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
    if on_message:
        on_message("error", content)
    return {"status": "error", "execution_count": count, "user_expressions": {}, "payload": [], **content}


def fanout_sandbox(sb: Sandbox, code: str, bindings: list[dict[str, Any]],
                   timeout: float | None = None, jobs: int = 1) -> list[Any]:
    """The Python API (Sandbox.fanout): run code once per dict of bindings, each in a fork of sb's
    current state with those names bound (pickled here, unpickled in the fork); sb is unchanged.
    Each item of the result is the run's ExecuteResult, or the SandboxError that ended it."""
    import base64
    import pickle
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"Sandbox.fanout: jobs is a whole number of workers, 1 or more, not {jobs!r}")
    if jobs > 1:
        raise SandboxError("Sandbox.fanout(jobs > 1) is not implemented: the Python API runs the forks in this "
                           "process, one after another (jobs=1); parallel worker engines are the kernel's "
                           "(`%%fanout NAME in EXPR --jobs N`)")
    out: list[Any] = []
    for binding in bindings:
        if not all(isinstance(k, str) and k.isidentifier() for k in binding):
            raise ValueError(f"fanout bindings are dicts of variable names: {list(binding)!r}")
        payload = base64.b64encode(pickle.dumps(dict(binding))).decode()
        child = sb.fork()
        try:
            r = child.execute(f"import pickle as _zp, base64 as _zb\nglobals().update(_zp.loads(_zb.b64decode("
                              f"{payload!r})))\ndel _zp, _zb", silent=True, store_history=False, timeout=timeout)
            if r.status != "ok":
                raise SandboxError(f"the bindings could not be set in the fork: {(r.error or {}).get('evalue')}")
            out.append(child.execute(code, timeout=timeout))
        except SandboxError as exc:
            out.append(exc)
        finally:
            child.close()
    return out
