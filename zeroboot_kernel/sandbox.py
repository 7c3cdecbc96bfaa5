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
from . import latency_trace
from .errors import ChannelError, SandboxCrashed, SandboxError, SandboxMemoryError, SandboxTimeout
from .frames import FrameType
from .native import Event, EventKind, Guest, Snapshot, monotonic_deadline

if TYPE_CHECKING:
    from .template import Template


StreamCallback = Callable[[str, str], None]            # (name, text)
# Output threads print between requests, held while nobody takes it live (Sandbox.idle_stream):
# at most this many characters (the newest half is kept past it).
HELD_OUTPUT_MAX = 1 << 20
# Comm messages (widget updates) sent between requests, held the same way (Sandbox.idle_comm): at
# most this many, and this many bytes of data and buffers (the newest are kept: a widget's last
# state is what the next request needs; a frame may be 16 MiB, and the engine's memory is the host's).
HELD_COMMS_MAX = 1000
HELD_COMMS_BYTES = 16 << 20
CommCallback = Callable[[dict[str, Any]], None]         # the COMM_MESSAGE's fields
MessageCallback = Callable[[str, dict[str, Any]], None]  # (msg_type, content)
# (prompt, password) -> reply, or None when an interrupt ended the wait (nothing is sent then:
# the interrupt stops the guest's read)
InputCallback = Callable[[str, bool], "str | None"]

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_LIMIT = 64 << 20
INTERRUPT_GRACE = 2.0
# After a request's reply the agent must go back to reading the UART at once; if it has not
# within this many seconds it is not the agent any more (user code took over the channel).
SETTLE_TIMEOUT = 5.0
# Fields the agent adds to every frame for the channel's self-check (docs/PROTOCOL.md).
CHECK_FIELDS = frames.CHECK_FIELDS


def comm_size(content: dict[str, Any]) -> int:
    """What a guest comm message (a decoded COMM_MESSAGE's fields) counts for against the output
    limit and the held messages' bound: its data as text and its buffers' bytes."""
    return len(str(content["data"])) + sum(len(b) for b in content["buffers"])


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
        self._interrupt = threading.Event()  # interrupt() was called; _serve acts on it
        self.interrupts_signalled = 0        # SIGINTs raised in the guest (one per request at most)
        # counts the snapshots and restores of this sandbox (each changes the state its memory
        # shares pages with): Session keeps a bound of its checkpoints' memory while it is unchanged
        self.generation = 0
        # Output threads and asyncio tasks print while no request runs (the agent's STREAM frames
        # numbered `idle`, docs/PROTOCOL.md "Output between requests"): given to idle_stream as it
        # comes (the engine server publishes it live, as ipykernel does); without one it is held,
        # at most HELD_OUTPUT_MAX characters (the newest), and goes out first with the next
        # request's output. Their comm messages (a widget updated) go to idle_comm the same way.
        self.idle_stream: StreamCallback | None = None
        self.idle_comm: CommCallback | None = None
        self._idle_next: int | None = None  # the `idle` number the next such frame carries (None: any)
        self._held: list[tuple[str, str]] = []
        self._held_chars = 0
        self._held_dropped = 0
        self._held_comms: list[tuple[int, dict[str, Any]]] = []  # (size, fields)
        self._held_comms_bytes = 0
        self._held_comms_dropped = 0
        # the agent waits for its next request with a timeout of its own: its asyncio loop has
        # tasks or timers a cell left (guest/_zeroboot_agent/agent_loop.py), which run between
        # requests as under ipykernel (Session.between_cells)
        self.waits_timed = False

    # ---- lifecycle ----
    def fork(self) -> Sandbox:
        """A new sandbox starting from this one's current state; this one is unchanged."""
        self._check_usable()
        snap = self.guest.snapshot()
        self.generation += 1
        try:
            child = Sandbox(snap.fork(), self.template, self.fresh)
        finally:
            snap.release()  # the child's memory keeps what it needs
        child.execution_count = self.execution_count
        return child

    def fanout(self, code: str, bindings: list[dict[str, Any]], timeout: float | None = None,
               jobs: int = 1) -> list[Any]:
        """Run code once per dict of bindings, each in its own fork of this sandbox's state (this
        one is unchanged): a list of ExecuteResult, or the SandboxError that ended a run (fanout.py).
        jobs: only 1 here (the runs go one after another in this process); parallel workers are the
        kernel's (`%%fanout ... --jobs N`), and jobs > 1 raises SandboxError saying so."""
        from .fanout import fanout_sandbox
        return fanout_sandbox(self, code, bindings, timeout, jobs=jobs)

    def snapshot(self) -> Snapshot:
        self._check_usable()
        snap = self.guest.snapshot()
        self.generation += 1
        return snap

    def checkpoint(self) -> Snapshot:
        """A rollback point (Guest.checkpoint): child processes allowed, ended by its restore."""
        self._check_usable()
        snap = self.guest.checkpoint()
        self.generation += 1
        return snap

    def restore(self, snap: Snapshot, *, fresh: bool = False) -> None:
        """Return to a snapshot of this lineage (also revives a broken sandbox)."""
        self.generation += 1
        self.guest.restore(snap)
        if self.memory_limit:
            self.guest.set_memory_limit(self.memory_limit)  # the session's setting, not the snapshot's
        self.broken = None
        self.fresh = fresh
        self._interrupt.clear()
        self._idle_next = None  # the guest's count of output frames between requests is the snapshot's
        self.waits_timed = False  # a restored loop's work goes on with the next request

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
                interrupt_grace: float = INTERRUPT_GRACE, poll: Callable[[], None] | None = None,
                parent_header: dict[str, Any] | None = None, trace: dict[str, int] | None = None,
                warm_up: bool = False) -> ExecuteResult:
        """Run one cell. `trace`: a dict that receives the cell's latency stamps, the agent's
        included (latency_trace.py); None: no stamps, and none asked of the agent.
        `warm_up`: a request that must leave no trace in the shell (see warm_up()).
        `parent_header`: the header of the kernel's execute_request, which the
        guest gives `get_ipython().kernel.get_parent()` (the Output widget captures by it). Streams go to on_stream(name, text) while the cell runs; display_data,
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
            "parent_header": parent_header or {},
        }
        if warm_up:
            request["warm_up"] = True
        self.fresh = False
        self._interrupt.clear()
        run = _CellRun(on_stream, on_message, on_input, output_limit, expect=(FrameType.DONE, self._request_id))
        before: dict[str, int] = {}
        if trace is not None:
            request["trace"] = True
            before = self.guest.stats()
            run.trace = trace
            trace["e_push"] = latency_trace.now()
        self.guest.push_input(frames.encode(FrameType.EXECUTE, request))
        reply = dict(self._serve(run, monotonic_deadline(timeout), interrupt_grace, poll))
        for name in CHECK_FIELDS:
            reply.pop(name, None)
        stamps = reply.pop("trace", None)  # the agent's, when asked for (frames.decode checked them)
        if trace is not None:
            trace.update(stamps if isinstance(stamps, dict) else {})
            after = self.guest.stats()
            trace.update({k: after[k] - before[k] for k in latency_trace.ENGINE_COUNTERS})
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

    def warm_up(self, timeout: float | None = None) -> None:
        """Run an empty, silent request once, before the first cell of a new fork.

        A fork runs on a VM whose shadow page tables know none of its pages, so its first request
        pays a shadow fault (~25 us here) for each of the ~2,000 pages the agent's request path
        touches: ~60 ms, where later cells take ~10 ms. Run while nobody waits (the kernel is still
        starting), this moves that cost off the user's first cell. The agent keeps the shell as it
        was (execution count, last_execution_result): no cell can tell it ran."""
        self.execute("pass", silent=True, store_history=False, timeout=timeout, warm_up=True)

    def comm(self, message: dict[str, Any], buffers: list[bytes], *, on_stream: StreamCallback | None = None,
             on_message: MessageCallback | None = None, timeout: float | None = None,
             interrupt_grace: float = INTERRUPT_GRACE, poll: Callable[[], None] | None = None,
             output_limit: int = DEFAULT_OUTPUT_LIMIT) -> dict[str, Any]:
        """Run one frontend comm message (comm_open / comm_msg / comm_close: `message` has kind,
        comm_id, data, metadata, target_name, parent_header) in the guest, like a small cell: its
        callbacks' output and comm messages go to the callbacks; returns the COMM_DONE payload
        (status, and the error fields when a callback raised)."""
        self._check_usable()
        self.fresh = False
        self._request_id += 1
        self._interrupt.clear()
        run = _CellRun(on_stream, on_message, None, output_limit, expect=(FrameType.COMM_DONE, self._request_id))
        self.guest.push_input(frames.encode(FrameType.COMM, {"id": self._request_id, **message}, buffers))
        reply = dict(self._serve(run, monotonic_deadline(timeout), interrupt_grace, poll))
        if not self.guest.finished and self.guest.cancel_alarm():
            log.info("a comm callback left an alarm armed; it was cancelled when the callback ended")
        return {k: v for k, v in reply.items() if k not in CHECK_FIELDS}

    def comm_info(self, target_name: str | None = None, sync: list[str] | None = None,
                  on_message: MessageCallback | None = None, timeout: float = 10.0) -> dict[str, dict[str, str]]:
        """The guest's comm registry {comm_id: {"target_name": ...}}, of one target or all. With
        `sync` (the comm ids the frontend has), the guest first closes, silently, the comms the
        frontend does not have and sends the state of the widgets it has (on_message "comm")."""
        self._check_usable()
        self._request_id += 1
        self._interrupt.clear()
        run = _CellRun(None, on_message, None, DEFAULT_OUTPUT_LIMIT,
                       expect=(FrameType.COMM_INFO_REPLY, self._request_id))
        self.guest.push_input(frames.encode(FrameType.COMM_INFO, {"id": self._request_id, "target_name": target_name,
                                                                  "sync": sync}))
        reply = self._serve(run, monotonic_deadline(timeout), INTERRUPT_GRACE)
        return dict(reply.get("comms") or {})

    def complete(self, code: str, cursor_pos: int, timeout: float = 10.0) -> dict[str, Any]:
        return self._simple_request(FrameType.COMPLETE, {"code": code, "cursor_pos": cursor_pos}, timeout)

    def inspect(self, code: str, cursor_pos: int, detail_level: int = 0, timeout: float = 10.0) -> dict[str, Any]:
        return self._simple_request(FrameType.INSPECT, {"code": code, "cursor_pos": cursor_pos,
                                                        "detail_level": detail_level}, timeout)

    def start_session(self, environ: dict[str, str], argv: tuple[str, ...] = (),
                      timeout: float = 60.0) -> dict[str, Any]:
        """SESSION: give the guest the kernel's forwarded environment (guest_environ.py), the
        notebook's sys.path and the kernel's arguments for sys.argv; sent once, before a session's
        clean snapshot."""
        reply = self._simple_request(FrameType.SESSION, {"environ": environ, "argv": list(argv)}, timeout)
        if reply.get("status") != "ok":
            raise SandboxError(f"the guest could not start the session: {str(reply.get('evalue'))[:500]}")
        return reply

    def _simple_request(self, ftype: FrameType, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._check_usable()
        self._request_id += 1
        self.guest.push_input(frames.encode(ftype, {"id": self._request_id, **payload}))
        answer = {FrameType.COMPLETE: FrameType.COMPLETE_REPLY, FrameType.INSPECT: FrameType.INSPECT_REPLY,
                  FrameType.SESSION: FrameType.SESSION_REPLY}[ftype]
        self._interrupt.clear()
        reply = self._serve(_CellRun(None, None, None, DEFAULT_OUTPUT_LIMIT, expect=(answer, self._request_id)),
                            monotonic_deadline(timeout), INTERRUPT_GRACE)
        return {k: v for k, v in reply.items() if k not in CHECK_FIELDS}

    # ---- the event loop of one request ----
    def _serve(self, run: _CellRun, deadline: float | None, grace: float,
               poll: Callable[[], None] | None = None) -> dict[str, Any]:
        """Run the guest until the request's reply, acting on interrupts (see _InterruptState),
        then until the agent waits for the next request again (_settle)."""
        state = _InterruptState(grace)
        self._give_held(run)
        while True:
            ev = self.guest.run(state.limit(deadline))
            if poll:
                poll()
            if ev.kind is EventKind.FRAME:
                payload = self._decode(ev)
                if "idle" in payload:
                    # a thread's or task's output or comm message sent before the agent began this
                    # request (it had read it, not yet started it): never once the request's own
                    # frames have begun
                    if run.seq:
                        raise self._break(ChannelError("the guest sent output numbered as between requests in "
                                                       "the middle of a request"))
                    self._idle_output(ev.frame_type, payload)
                    continue
                try:
                    done = run.frame(ev.frame_type, payload, self)
                except ChannelError as exc:
                    raise self._break(exc)
                if done is not None:
                    self._idle_next = 0  # the agent numbers its output between requests from 0 again
                    if run.trace is not None:
                        run.trace["e_done"] = latency_trace.now()
                    self._settle()  # an interrupt that came with the reply is dropped there
                    if run.trace is not None:
                        run.trace["e_settled"] = latency_trace.now()
                    return done
            elif ev.kind is EventKind.OUTPUT:
                run.stream("stdout" if ev.stream == 1 else "stderr", ev.data.decode(errors="replace"))
            elif ev.kind is EventKind.KICK:
                pass  # interrupt() woke the run: handled below
            elif ev.kind is EventKind.TIMEOUT:
                if state.grace_over():
                    raise self._break(SandboxTimeout(f"the cell did not stop within {grace:g} s of the interrupt",
                                                      after_interrupt=True))
                raise self._break(SandboxTimeout("the cell ran past its time limit and was stopped"))
            elif ev.kind is EventKind.INPUT:
                if run.asked is None:
                    raise self._break(ChannelError("the guest agent is waiting for a request in the middle of one "
                                                   "(its reply never came)"))
                run.answer(self)  # may take long (a person types): interrupts meanwhile are handled below
            else:
                raise self._break(self._failure(ev))
            self._take_interrupts(state, run)

    def _take_interrupts(self, state: _InterruptState, run: _CellRun) -> None:
        """The guest is stopped: act on the interrupts that came since the last stop."""
        if self._interrupt.is_set():
            self._interrupt.clear()
            state.request()
        if state.should_signal():
            run.interrupted = True
            try:
                self.guest.raise_signal(signal.SIGINT)
                self.interrupts_signalled += 1
            except SandboxError:
                pass  # no handler: the grace period ends it

    def _settle(self) -> None:
        """After a reply: let the agent return to reading the UART, so that the next request is
        pushed only once it waits for one. The agent's interrupt handling relies on this (an
        interrupt raised after this point is for the next request, guest/agent_io.py
        InterruptGate), and so does the channel's self-check (nothing may follow a reply)."""
        deadline = monotonic_deadline(SETTLE_TIMEOUT)
        while True:
            ev = self.guest.run(deadline)
            if ev.kind is EventKind.INPUT:
                self.waits_timed = ev.timed
                return
            if ev.kind is EventKind.KICK:
                continue  # an interrupt for the request that just ended: dropped
            if ev.kind is EventKind.FRAME:
                if not self._between_requests_frame(ev):
                    raise self._break(ChannelError(f"the guest sent a frame (type {ev.frame_type}) after the reply"))
                continue
            if ev.kind is EventKind.OUTPUT:
                continue  # raw console output (the agent's log): not cell output
            if ev.kind is EventKind.TIMEOUT:
                raise self._break(ChannelError("the guest agent did not return to waiting for requests after "
                                               "its reply"))
            raise self._break(self._failure(ev))

    # ---- between requests ----
    def threads_alive(self) -> int:
        """The guest's live threads (1: only the agent's)."""
        return int(self.guest.stats()["threads"])

    def run_between_requests(self, request_waiting: Callable[[], bool]) -> BetweenRequests:
        """Run the guest's other threads, and the tasks and timers of the agent's asyncio loop
        (waits_timed), while the agent waits for its next request, as they run between cells
        under ipykernel: until request_waiting() is true after a kick (the caller makes a
        request's arrival kick the run: EngineServer watches its socket), or until nothing can run
        or wake by itself (then nothing can change before a request and nothing spins). Call it
        only when the agent waits for a request (after a reply's _settle). Output the threads and
        tasks print goes to idle_stream as it comes (else it is held for the next request).
        Raises what a crash of a thread (or the guest sending a frame now) is; the sandbox is
        broken then and the caller restores it."""
        self._check_usable()
        before = self.guest.stats()
        self.guest.set_input_yields(True)
        try:
            while True:
                if request_waiting():
                    outcome = "request"
                    break
                ev = self.guest.run(None)
                if ev.kind is EventKind.INPUT:
                    outcome = "idle"
                    break
                if ev.kind in (EventKind.KICK, EventKind.OUTPUT):
                    continue  # a kick: a request, or an interrupt between cells (dropped); raw console output
                if ev.kind is EventKind.FRAME:
                    if not self._between_requests_frame(ev):
                        raise self._break(ChannelError(f"the guest sent a frame (type {ev.frame_type}) between "
                                                       "requests"))
                    continue
                raise self._break(self._failure(ev))
        finally:
            self.guest.set_input_yields(False)
        self.waits_timed = False  # idle: the wait has no timeout; a request: it is being served
        after = self.guest.stats()
        # the guest ran: another thread was switched in, or the agent's wait ended (its loop ran)
        # and the guest ran on (a KVM_RUN that returned); a wait that only slept runs nothing
        ran = after["thread_switches"] != before["thread_switches"] or after["exits"] != before["exits"]
        return BetweenRequests(outcome, ran)

    # ---- output between requests ----
    def _decode(self, ev: Event) -> dict[str, Any]:
        try:  # checked against its type's shape: user code can write frames too
            return frames.decode(ev.frame_type, ev.data)
        except ValueError as exc:
            raise self._break(SandboxError(str(exc)))

    def _between_requests_frame(self, ev: Event) -> bool:
        """A frame while the agent waits for a request: True if it was a thread's or task's output
        or comm message (a STREAM or COMM_MESSAGE frame numbered `idle`), delivered; False for
        anything else (the caller breaks the channel)."""
        if ev.frame_type not in frames.IDLE_TYPES:
            return False
        payload = self._decode(ev)
        if "idle" not in payload:
            return False
        self._idle_output(ev.frame_type, payload)
        return True

    def _idle_output(self, ftype: int, payload: dict[str, Any]) -> None:
        """Check and deliver one STREAM or COMM_MESSAGE frame sent between requests (numbered
        `idle` 0, 1, 2, ... since the last reply; after a restore the first one sets the count)."""
        if ftype not in frames.IDLE_TYPES or "seq" in payload or "stream_chars" in payload:
            raise self._break(ChannelError(f"the guest sent a frame (type {ftype}) numbered as output between "
                                           f"requests that is not such output"))
        number = payload["idle"]
        if self._idle_next is not None and number != self._idle_next:
            raise self._break(ChannelError(f"the cell channel lost or reordered output between requests: frame "
                                           f"#{self._idle_next} was expected, #{number} arrived"))
        self._idle_next = number + 1
        if ftype == FrameType.COMM_MESSAGE:
            self._idle_comm({k: v for k, v in payload.items() if k not in CHECK_FIELDS})
            return
        name, text = str(payload.get("name", "stdout")), str(payload.get("text", ""))
        if self.idle_stream is not None:
            self.idle_stream(name, text)
            return
        self._held.append((name, text))
        self._held_chars += len(text)
        if self._held_chars > HELD_OUTPUT_MAX:  # keep the newest half
            kept: list[tuple[str, str]] = []
            room = HELD_OUTPUT_MAX // 2
            for held_name, held_text in reversed(self._held):
                piece = held_text[-room:] if room > 0 else ""
                self._held_dropped += len(held_text) - len(piece)
                room -= len(piece)
                if piece:
                    kept.append((held_name, piece))
            self._held = kept[::-1]
            self._held_chars = HELD_OUTPUT_MAX // 2 - room

    def _idle_comm(self, content: dict[str, Any]) -> None:
        """A comm message sent between requests: to idle_comm, else held for the next request."""
        if self.idle_comm is not None:
            self.idle_comm(content)
            return
        size = comm_size(content)
        self._held_comms.append((size, content))
        self._held_comms_bytes += size
        while len(self._held_comms) > HELD_COMMS_MAX or self._held_comms_bytes > HELD_COMMS_BYTES:
            dropped, _ = self._held_comms.pop(0)
            self._held_comms_bytes -= dropped
            self._held_comms_dropped += 1

    def _give_held(self, run: _CellRun) -> None:
        """Output and comm messages held since the last request (no idle_stream, idle_comm): a
        cell's first output."""
        if self._held_comms_dropped:
            log.warning("%d comm messages sent between cells were dropped (the newest %d, %d MiB at most, "
                        "are kept)", self._held_comms_dropped, HELD_COMMS_MAX, HELD_COMMS_BYTES >> 20)
        for _, content in self._held_comms:
            run.message("comm", content)
        self._held_comms, self._held_comms_bytes, self._held_comms_dropped = [], 0, 0
        if run.on_stream is None or not (self._held or self._held_dropped):
            return
        if self._held_dropped:
            run.stream("stderr", f"[zeroboot: {self._held_dropped} characters of output that threads printed "
                                 f"between cells were dropped; the last {self._held_chars} follow]\n")
        for name, text in self._held:
            run.stream(name, text)
        self._held, self._held_chars, self._held_dropped = [], 0, 0

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


@dataclass
class BetweenRequests:
    """How Sandbox.run_between_requests ended: "request" (one arrived) or "idle" (nothing can
    run or wake by itself); `ran`: guest code ran (another thread, or the agent's loop), so the
    state changed since the run began."""

    outcome: str
    ran: bool


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
        self.seq = 0               # the number the next frame from the agent must carry
        self.stream_chars = 0      # characters received in STREAM frames (before any truncation)
        self.asked: tuple[str, bool] | None = None  # an INPUT_REQUEST not answered yet
        self.trace: dict[str, int] | None = None     # latency stamps (Sandbox.execute's trace)

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

    def check(self, ftype: int, p: dict[str, Any]) -> None:
        """The channel's self-check: frames numbered 0, 1, 2, ... and, in the reply, as many
        stream characters as arrived. Raises ChannelError on any difference."""
        seq = p.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq != self.seq:
            what = "lost or reordered" if isinstance(seq, int) and not isinstance(seq, bool) else "not numbered"
            raise ChannelError(f"the cell channel {what} frames: frame #{self.seq} of this request was expected, "
                               f"a frame of type {ftype} numbered {seq!r} arrived")
        self.seq += 1
        if ftype in frames.REPLY_TYPES:
            written = p.get("stream_chars")
            if written != self.stream_chars:
                raise ChannelError(f"the cell wrote {written!r} characters of output but {self.stream_chars} arrived")

    def frame(self, ftype: int, p: dict[str, Any], sb: Sandbox) -> dict[str, Any] | None:
        """Handle one frame; returns the final reply when the request is complete."""
        self.check(ftype, p)
        self.asked = None  # a frame after an INPUT_REQUEST: the agent no longer waits for its reply
        if ftype == FrameType.STREAM:
            text = str(p.get("text", ""))
            self.stream_chars += len(text)
            self.stream(str(p.get("name", "stdout")), text)
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
        elif ftype == FrameType.COMM_MESSAGE:
            content = {k: v for k, v in p.items() if k not in CHECK_FIELDS}
            if self._within_limit(comm_size(content)):
                self.message("comm", content)
        elif ftype == FrameType.INPUT_REQUEST:
            # Answered once the agent blocks reading the reply (the INPUT event, answer()): an
            # interrupt that lands while the frame is written stops the cell before it reads, and
            # then nobody is asked for an answer the cell would not read.
            self.asked = (str(p.get("prompt", "")), bool(p.get("password")))
        elif ftype in (FrameType.DONE, FrameType.COMPLETE_REPLY, FrameType.INSPECT_REPLY, FrameType.SESSION_REPLY,
                       FrameType.COMM_DONE, FrameType.COMM_INFO_REPLY):
            if self.expect is not None and (ftype, p.get("id")) != self.expect:
                raise ChannelError(f"the reply to another request (type {ftype}, id {p.get('id')!r}) arrived")
            if ftype == FrameType.DONE and p.get("status") == "error" and self.error is None:
                self.error = {k: p.get(k) for k in ("ename", "evalue", "traceback")}
            return p
        return None

    def answer(self, sb: Sandbox) -> None:
        """The agent waits for the reply to its INPUT_REQUEST: ask the frontend. An interrupt
        that ends the wait (on_input returns None) sends nothing: the guest's read then fails
        with EINTR and input() raises KeyboardInterrupt, never returning a value nobody typed;
        if the guest reads again (it ignores SIGINT), the frontend is asked again."""
        assert self.asked is not None
        prompt, password = self.asked
        value = self.on_input(prompt, password) if self.on_input is not None else ""
        if value is not None:
            self.asked = None
            sb.guest.push_input(frames.encode(FrameType.INPUT_REPLY, {"value": value}))


class _InterruptState:
    """What interrupts have done to one request: soft first, then a rollback.

    The first interrupt raises SIGINT in the guest (once; the agent turns it into
    KeyboardInterrupt in user code) and starts the grace period; more interrupts of the same
    request do nothing more. If the request is still running when the grace period is over, the
    run times out and the caller rolls the sandbox back, which can therefore happen at most once
    per request."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.requested = 0
        self.signalled = False
        self.grace_deadline: float | None = None

    def request(self) -> None:
        """An interrupt arrived."""
        self.requested += 1

    def should_signal(self) -> bool:
        """True exactly once, for the first interrupt."""
        if self.requested and not self.signalled:
            self.signalled = True
            self.grace_deadline = time.monotonic() + self.grace
            return True
        return False

    def limit(self, deadline: float | None) -> float | None:
        candidates = [d for d in (deadline, self.grace_deadline) if d]
        return min(candidates) if candidates else None

    def grace_over(self) -> bool:
        return self.grace_deadline is not None and time.monotonic() >= self.grace_deadline
