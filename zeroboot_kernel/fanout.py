"""`%%fanout NAME in EXPR`: run a cell once per value of EXPR, each in its own fork of the live state.

The engine server sends a cell that starts with `%%fanout` here instead of to Session.execute (the
cell is the user's code, as the kernel sent it). EXPR is evaluated once, in a fork of the live
state; that fork's state (with the values) is snapshotted and every value's run is a fork of it,
with NAME bound, so no run sees another's changes and the live state is not changed by them. Each
run's output goes out as the cell's, after a label line; an error, crash or timeout of one run is
reported for that value and the others go on. The runs' results (the value of the body's last
expression, pickled in the fork) become `_fanout` in the live state, through one ordinary cell, so
that `%rewind` undoes it like any cell. An interrupt reaches the running fork and ends the fan-out.
Runs go one after another: the engine process has one vCPU (issue 19 asks for `--jobs`; it is not
implemented and is refused).
"""
from __future__ import annotations

import logging
import re
from typing import Any, Callable

from .errors import SandboxError
from .sandbox import Sandbox

log = logging.getLogger("zeroboot_kernel.fanout")

HEADER = re.compile(r"%%fanout[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+in[ \t]+(\S.*?)[ \t]*")
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


def parse(code: str) -> tuple[str, str, str]:
    """(NAME, EXPR, body) of a %%fanout cell, or SandboxError saying how to write it."""
    first, _, body = code.lstrip().partition("\n")
    m = HEADER.fullmatch(first.rstrip())
    if not m:
        raise SandboxError("usage: %%fanout NAME in EXPR (the first line of the cell), then the cell's body; "
                           "for example `%%fanout lr in [0.1, 0.01]`")
    if m.group(2).startswith("--") or " --jobs" in m.group(2):
        raise SandboxError("%%fanout --jobs is not implemented: the runs go one after another")
    if not body.strip():
        raise SandboxError("%%fanout needs a cell body to run for each value")
    return m.group(1), m.group(2), body


def _quiet(sb: Sandbox, code: str, timeout: float | None) -> tuple[str, Any]:
    out: list[str] = []
    r = sb.execute(code, store_history=False, timeout=timeout,
                   on_stream=lambda name, text: out.append(text) if name == "stdout" else None)
    return "".join(out), r


def run(session: Any, code: str, *, execution_count: int, on_stream: Callable[[str, str], None] | None,
        on_message: Callable[[str, dict[str, Any]], None] | None,
        poll: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run the %%fanout cell; the execute_reply content. While a run goes on, session.running_fork
    is its Sandbox, which an interrupt reaches (engine_server.interrupt); an interrupted run
    ends the fan-out (the values after it are not run)."""
    def say(name: str, text: str) -> None:
        if on_stream:
            on_stream(name, text)

    try:
        name, expr, body = parse(code)
    except SandboxError as exc:
        return _error(execution_count, "UsageError", str(exc), on_message)
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
            return _error(execution_count, str(err.get("ename", "Error")),
                          f"%%fanout: EXPR failed: {err.get('evalue', '')}", on_message)
        count = int(text.strip()) if text.strip().isdigit() else -1
        if not 0 <= count <= MAX_VALUES:
            return _error(execution_count, "ValueError", f"%%fanout runs 0 to {MAX_VALUES} values, not {text.strip()[:40]!r}",
                          on_message)
        values = values_fork.snapshot()
    except SandboxError as exc:
        return _error(execution_count, type(exc).__name__, f"%%fanout: EXPR failed: {exc}", on_message)
    finally:
        session.running_fork = None
        values_fork.close()
    results: list[str | None] = []
    total = 0
    try:
        for i in range(count):
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
            except SandboxError as exc:  # a crash, timeout or memory error of this run only
                say("stderr", f"[{i}] {name}: {type(exc).__name__}: {exc}\n")
                results.append(None)
            finally:
                session.running_fork = None
                child.close()
    finally:
        values.release()
    listing = ", ".join("None" if b is None else f"_zp.loads(_zb.b64decode({b!r}))" for b in results)
    reply = session.execute(f"import pickle as _zp, base64 as _zb\n_fanout = [{listing}]\ndel _zp, _zb",
                            execution_count=execution_count, silent=True, store_history=False)
    if reply.get("status") != "ok":
        say("stderr", f"_fanout could not be set: {reply.get('evalue')}\n")
    return {"status": "ok", "execution_count": execution_count, "user_expressions": {}, "payload": []}


def _error(count: int, ename: str, evalue: str, on_message: Callable[[str, dict[str, Any]], None] | None) -> dict[str, Any]:
    content = {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
    if on_message:
        on_message("error", content)
    return {"status": "error", "execution_count": count, "user_expressions": {}, "payload": [], **content}


def fanout_sandbox(sb: Sandbox, code: str, bindings: list[dict[str, Any]],
                   timeout: float | None = None) -> list[Any]:
    """The Python API (Sandbox.fanout): run code once per dict of bindings, each in a fork of sb's
    current state with those names bound (pickled here, unpickled in the fork); sb is unchanged.
    Each item of the result is the run's ExecuteResult, or the SandboxError that ended it."""
    import base64
    import pickle
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
