"""Sandboxes that execute notebook cells: the host side of the cell channel (docs/PROTOCOL.md).
A Sandbox wraps a Guest running the guest agent; see zeroboot_kernel.engine for the overview.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from . import frames
from .errors import SandboxCrashed, SandboxError, SandboxMemoryError, SandboxTimeout
from .frames import FrameType
from .native import Event, EventKind, Guest, Snapshot, monotonic_deadline

if TYPE_CHECKING:
    from .template import Template


StreamCallback = Callable[[str, str], None]            # (name, text)
MessageCallback = Callable[[str, dict[str, Any]], None]  # (msg_type, content)
InputCallback = Callable[[str, bool], str]             # (prompt, password) -> reply

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_LIMIT = 64 << 20
INTERRUPT_GRACE = 2.0


@dataclass
class ExecuteResult:
    """What a cell did. `reply` is the agent's DONE payload (the execute_reply content)."""

    status: str
    execution_count: int
    result: dict[str, Any] | None = None         # execute_result data bundle
    error: dict[str, Any] | None = None          # ename / evalue / traceback
    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)
    output_truncated: bool = False
    interrupted: bool = False
    seconds: float = 0.0


class Sandbox:
    """A guest agent ready to run cells: forked from a template or from another sandbox."""

    def __init__(self, guest: Guest, template: "Template | None", fresh: bool) -> None:
        self.guest = guest
        self.template = template
        self.fresh = fresh            # started from the template: reseed before the next cell
        self.memory_limit = 0         # bytes, 0 = all of the guest's memory (%sandbox memory)
        self.broken: str | None = None
        self.execution_count = 0
        self._request_id = 0
        self._interrupt = threading.Event()

    # ---- lifecycle ----
    def fork(self) -> Sandbox:
        """A new sandbox starting from this one's current state; this one is unchanged."""
        self._check_usable()
        snap = self.guest.snapshot()
        try:
            child = Sandbox(snap.fork(), self.template, self.fresh)
        finally:
            snap.release()  # the child's memory keeps what it needs
        child.execution_count = self.execution_count
        return child

    def snapshot(self) -> Snapshot:
        self._check_usable()
        return self.guest.snapshot()

    def restore(self, snap: Snapshot, *, fresh: bool = False) -> None:
        """Return to a snapshot of this lineage (also revives a broken sandbox)."""
        self.guest.restore(snap)
        if self.memory_limit:
            self.guest.set_memory_limit(self.memory_limit)  # the session's setting, not the snapshot's
        self.broken = None
        self.fresh = fresh
        self._interrupt.clear()

    def close(self) -> None:
        self.guest.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def interrupt(self) -> None:
        """KeyboardInterrupt in the running cell (thread-safe)."""
        self._interrupt.set()
        self.guest.kick()

    # ---- requests ----
    def execute(self, code: str, *, on_stream: StreamCallback | None = None, on_message: MessageCallback | None = None,
                on_input: InputCallback | None = None, timeout: float | None = None, silent: bool = False,
                store_history: bool = True, user_expressions: dict[str, str] | None = None,
                execution_count: int | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                interrupt_grace: float = INTERRUPT_GRACE, poll: Callable[[], None] | None = None) -> ExecuteResult:
        """Run one cell. Streams go to on_stream(name, text) while the cell runs; display_data,
        update_display_data, execute_result, error and clear_output messages to on_message.
        `poll` is called after every event (the engine server reads its control messages there,
        e.g. an interrupt)."""
        self._check_usable()
        if execution_count is None:
            execution_count = self.execution_count + (0 if silent else 1)
        self._request_id += 1
        request = {
            "id": self._request_id, "code": code, "silent": silent, "store_history": store_history,
            "user_expressions": user_expressions or {}, "allow_stdin": on_input is not None,
            "execution_count": execution_count,
            "reseed": os.urandom(32).hex() if self.fresh else None,
        }
        self.fresh = False
        self._interrupt.clear()
        run = _CellRun(on_stream, on_message, on_input, output_limit, expect=(FrameType.DONE, self._request_id))
        self.guest.push_input(frames.encode(FrameType.EXECUTE, request))
        reply = dict(self._serve(run, monotonic_deadline(timeout), interrupt_grace, poll))
        if not self.guest.finished and self.guest.cancel_alarm():
            # an alarm belongs to its cell: going off later it would hit the agent between cells
            log.info("cell %d left an alarm armed; it was cancelled when the cell ended", execution_count)
        if not silent and store_history:
            self.execution_count = execution_count
        # the reply comes from the guest, where user code can write frames too: only two statuses
        status = reply["status"] = "ok" if reply.get("status") == "ok" else "error"
        if not isinstance(reply.get("execution_count"), int):
            reply["execution_count"] = execution_count
        return ExecuteResult(status=status, execution_count=int(reply.get("execution_count", execution_count)),
                             result=run.result, error=run.error if status != "ok" else None,
                             stdout="".join(run.stdout), stderr="".join(run.stderr), displays=run.displays,
                             reply=reply, output_truncated=run.truncated, interrupted=run.interrupted,
                             seconds=time.monotonic() - run.started)

    def complete(self, code: str, cursor_pos: int, timeout: float = 10.0) -> dict[str, Any]:
        return self._simple_request(FrameType.COMPLETE, {"code": code, "cursor_pos": cursor_pos}, timeout)

    def inspect(self, code: str, cursor_pos: int, detail_level: int = 0, timeout: float = 10.0) -> dict[str, Any]:
        return self._simple_request(FrameType.INSPECT, {"code": code, "cursor_pos": cursor_pos,
                                                        "detail_level": detail_level}, timeout)

    def start_session(self, environ: dict[str, str], timeout: float = 60.0) -> dict[str, Any]:
        """SESSION: give the guest the kernel's forwarded environment (guest_environ.py) and the
        notebook's sys.path; sent once, before a session's clean snapshot."""
        reply = self._simple_request(FrameType.SESSION, {"environ": environ}, timeout)
        if reply.get("status") != "ok":
            raise SandboxError(f"the guest could not start the session: {str(reply.get('evalue'))[:500]}")
        return reply

    def _simple_request(self, ftype: FrameType, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._check_usable()
        self._request_id += 1
        self.guest.push_input(frames.encode(ftype, {"id": self._request_id, **payload}))
        answer = {FrameType.COMPLETE: FrameType.COMPLETE_REPLY, FrameType.INSPECT: FrameType.INSPECT_REPLY,
                  FrameType.SESSION: FrameType.SESSION_REPLY}[ftype]
        return self._serve(_CellRun(None, None, None, DEFAULT_OUTPUT_LIMIT, expect=(answer, self._request_id)),
                           monotonic_deadline(timeout), INTERRUPT_GRACE)

    # ---- the event loop of one request ----
    def _serve(self, run: _CellRun, deadline: float | None, grace: float,
               poll: Callable[[], None] | None = None) -> dict[str, Any]:
        grace_deadline: float | None = None
        while True:
            limit = min(d for d in (deadline, grace_deadline) if d) if (deadline or grace_deadline) else None
            ev = self.guest.run(limit)
            if poll:
                poll()
            if self._interrupt.is_set() and ev.kind is not EventKind.KICK:
                self.guest.kick()  # an interrupt noticed by poll(): act on it at the next run
            if ev.kind is EventKind.FRAME:
                try:  # checked against its type's shape: user code can write frames too
                    payload = frames.decode(ev.frame_type, ev.data)
                except ValueError as exc:
                    raise self._break(SandboxError(str(exc)))
                done = run.frame(ev.frame_type, payload, self)
                if done is not None:
                    return done
            elif ev.kind is EventKind.OUTPUT:
                run.stream("stdout" if ev.stream == 1 else "stderr", ev.data.decode(errors="replace"))
            elif ev.kind is EventKind.KICK:
                if self._interrupt.is_set() and grace_deadline is None:
                    self._interrupt.clear()
                    run.interrupted = True
                    try:
                        self.guest.raise_signal(signal.SIGINT)
                    except SandboxError:
                        pass  # no handler: the grace period ends it
                    grace_deadline = time.monotonic() + grace
            elif ev.kind is EventKind.TIMEOUT:
                if grace_deadline is not None and time.monotonic() >= grace_deadline:
                    raise self._break(SandboxTimeout(f"the cell did not stop within {grace:g} s of the interrupt"))
                raise self._break(SandboxTimeout("the cell ran past its time limit and was stopped"))
            elif ev.kind is EventKind.INPUT:
                raise self._break(SandboxError("the guest agent is waiting for a request in the middle of one"))
            else:
                raise self._break(self._failure(ev))

    def _failure(self, ev: Event) -> Exception:
        if ev.kind is EventKind.FAULT:
            st = self.guest.stats()
            if st["guest_pages_limit"] and st["guest_pages"] >= 0.95 * st["guest_pages_limit"]:
                limit = st["guest_pages_limit"] * 4096 >> 20
                return SandboxMemoryError(f"the sandbox ran out of its {limit} MiB of memory and crashed "
                                          f"({ev.message}); the host's memory is not the limit: raise it with "
                                          f"`%sandbox memory SIZE` or ZEROBOOT_MEMORY=SIZE in the kernelspec's env.")
            return SandboxCrashed(ev.message, ev.signal, ev.rip)
        if ev.kind is EventKind.EXIT:
            return SandboxCrashed(f"the guest agent exited with status {ev.status}")
        return SandboxError(ev.message or f"unexpected event {ev.kind.name}")

    def _break(self, exc: Exception) -> Exception:
        self.broken = str(exc)
        return exc

    def _check_usable(self) -> None:
        if self.broken:
            raise SandboxError(f"this sandbox is broken ({self.broken}); restore it from a snapshot")


class _CellRun:
    """Collects what one request produced and forwards it to the callbacks."""

    def __init__(self, on_stream: StreamCallback | None, on_message: MessageCallback | None,
                 on_input: InputCallback | None, output_limit: int,
                 expect: tuple[int, int] | None = None) -> None:
        self.on_stream = on_stream
        self.on_message = on_message
        self.on_input = on_input
        self.limit = output_limit
        self.expect = expect  # (frame type, request id) of the frame that ends this request
        self.sent = 0
        self.truncated = False
        self.interrupted = False
        self.started = time.monotonic()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.displays: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None

    def _within_limit(self, size: int) -> bool:
        if self.truncated:
            return False
        self.sent += size
        if self.sent <= self.limit:
            return True
        self.truncated = True
        note = f"\n[zeroboot: output truncated: this cell printed more than {self.limit >> 20} MiB]\n"
        self.stderr.append(note)
        if self.on_stream:
            self.on_stream("stderr", note)
        return False

    def stream(self, name: str, text: str) -> None:
        if not self._within_limit(len(text)):
            return
        (self.stdout if name == "stdout" else self.stderr).append(text)
        if self.on_stream:
            self.on_stream(name, text)

    def message(self, msg_type: str, content: dict[str, Any]) -> None:
        if self.on_message:
            self.on_message(msg_type, content)

    def frame(self, ftype: int, p: dict[str, Any], sb: Sandbox) -> dict[str, Any] | None:
        """Handle one frame; returns the final reply when the request is complete."""
        if ftype == FrameType.STREAM:
            self.stream(str(p.get("name", "stdout")), str(p.get("text", "")))
        elif ftype == FrameType.DISPLAY:
            content = {k: p.get(k, {}) for k in ("data", "metadata", "transient")}
            if self._within_limit(len(str(content["data"]))):
                self.displays.append(content)
                self.message("update_display_data" if p.get("update") else "display_data", content)
        elif ftype == FrameType.RESULT:
            self.result = p.get("data", {})
            self.message("execute_result", {k: p.get(k, {}) for k in ("data", "metadata")} |
                         {"execution_count": p.get("execution_count")})
        elif ftype == FrameType.ERROR:
            self.error = {k: p.get(k) for k in ("ename", "evalue", "traceback")}
            self.message("error", self.error)
        elif ftype == FrameType.CLEAR_OUTPUT:
            self.message("clear_output", {"wait": bool(p.get("wait"))})
        elif ftype == FrameType.INPUT_REQUEST:
            value = self.on_input(str(p.get("prompt", "")), bool(p.get("password"))) if self.on_input else ""
            sb.guest.push_input(frames.encode(FrameType.INPUT_REPLY, {"value": value}))
        elif ftype in (FrameType.DONE, FrameType.COMPLETE_REPLY, FrameType.INSPECT_REPLY, FrameType.SESSION_REPLY):
            if self.expect is not None and (ftype, p.get("id")) != self.expect:
                return None  # the end of another request, or a frame user code forged: not ours
            if ftype == FrameType.DONE and p.get("status") == "error" and self.error is None:
                self.error = {k: p.get(k) for k in ("ename", "evalue", "traceback")}
            return p
        return None
