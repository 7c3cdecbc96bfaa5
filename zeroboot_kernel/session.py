"""A notebook session: one sandbox, its execution mode, its checkpoints, and rollback.

Runs inside the engine process (engine_server.py). Modes:
  chained   cell N runs on the state left by cell N-1 (what notebook users expect). Before each
            cell a checkpoint is taken (it costs what the previous cell wrote); the last K are
            kept for %rewind, and a cell that crashes, times out or ignores an interrupt is rolled
            back to its checkpoint, so it costs one cell, never the session. The checkpoints'
            memory is bounded by a budget (checkpoint_budget.py): the oldest go first, spilled
            to a per-session file on disk while its disk budget allows (checkpoint_spill.py),
            else dropped.
            Batch runs (batch.py) ask for `requested` checkpoints instead: only cells that ask
            (those whose error lets the notebook go on) get one; a crash of any other cell ends
            its notebook anyway, so its checkpoint would only cost time (a third of a small
            notebook's, measured) and its crash goes back to the last checkpoint there is.
  isolated  every cell starts from the clean template (teaching, grading).
Completion and inspection run against the current state and are rolled back afterwards.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from . import checkpoint_budget as budget
from . import checkpoint_spill as spill
from . import export
from . import latency_trace
from .engine_requests import CHECKPOINT_POLICIES, EVERY_CELL, REQUESTED
from .errors import SandboxCrashed, SandboxError, SandboxMemoryError, SandboxTimeout
from .guest_view import GUEST_HOME
from .guest_environ import session_environment
from .guest_memory_size import describe
from .project_root import find_project_root
from .native import Snapshot, give_back_dead_store_pages, keep_spare_pages, snapshots_memory
from .sandbox import InputCallback, MessageCallback, Sandbox, StreamCallback
from .template import Template, cache_root

log = logging.getLogger(__name__)
# seconds the warm-up request before a session's first cell may take (Session.warm_up)
WARM_UP_TIMEOUT = 30.0

MODES = ("chained", "isolated")


@dataclass
class Checkpoint:
    number: int            # the execution count of the cell that ran after it was taken
    code: str              # that cell's source, for %sandbox checkpoints
    snapshot: Snapshot | None  # None: spilled to disk (`spilled`)
    taken: float
    spilled: spill.SpillRef | None = None
    writing: spill.PendingSpill | None = None  # being spilled: `snapshot` stays until the write is done
    # why it is gone although newer and older ones are kept (a gap in %rewind's list, which keeps
    # every other checkpoint's depth): "" while it can be rewound to
    dropped: str = ""

    def where(self) -> str:
        if self.dropped:
            return "dropped"
        return "writing" if self.writing is not None else "memory" if self.snapshot is not None else "disk"


FILES_MODES = ("overlay", "readonly", "readwrite")
# Directories the guest has of its own (guest_view.GuestSpec.overlay_dirs): no notebook folder there.
GUEST_PRIVATE_DIRS = ("/tmp", GUEST_HOME, "/dev/shm")


# What stops a checkpoint between cells, and how to end it (the note of a cell that runs without a
# checkpoint of its own)
_ENDING_HELPERS = ("A connection waiting on a listening socket: accept it (or close the listener: listener.close(), "
                   "manager.shutdown(), server.server_close()); fds sent over a socket and not received yet: "
                   "receive them or close the socket")


def lost_children_note(snap: Snapshot) -> str:
    """What a restore of snap ended (Snapshot.lost_children), for the rollback's message."""
    pids = snap.lost_children()
    if not pids:
        return ""
    shown = ", ".join(str(p) for p in pids[:8]) + (", ..." if len(pids) > 8 else "")
    return (f" Child processes it had (pid{'s' if len(pids) > 1 else ''} {shown}) did not come back: a checkpoint "
            f"holds the notebook's own process only, so they ended and it sees them killed (SIGKILL). joblib starts "
            f"new workers by itself and a Popen reports -9, but a multiprocessing Pool made before then hangs, as "
            f"after kill -9 (its idle workers held its queue's lock): make a new Pool.")


class Session:
    def __init__(self, template: Template, *, mode: str = "chained", keep: int = 20,
                 timeout: float | None = None, interrupt_grace: float = 2.0,
                 project_dir: str | None = None, files: str = "overlay", hidden: tuple[str, ...] = (),
                 environ: dict[str, str] | None = None, project_root: str | None = None,
                 checkpoint_memory: int | None = None, checkpoint_disk: int | None = None,
                 spill_waits: bool | None = None, checkpoint_policy: str = EVERY_CELL,
                 argv: tuple[str, ...] = ()) -> None:
        """project_dir: the notebook's folder (the cells' working directory); project_root: the
        folder shown in the sandbox, which contains it (default: found by project_root.py); hidden:
        paths relative to project_root the sandbox does not see (credentials, histories).
        environ: the variables the guest gets (default: this process's, by guest_environ.py).
        argv: the kernel's arguments, sys.argv[1:] in the guest (as ipykernel_launcher's).
        checkpoint_memory: the checkpoints' memory budget (None: checkpoint_budget's default);
        checkpoint_disk: the spill file's disk budget (None: ZEROBOOT_CHECKPOINT_DISK, else
        checkpoint_spill's default; 0: checkpoints over the memory budget are dropped, not spilled);
        spill_waits: a checkpoint that must leave memory while the spill writer is still busy waits
        for it (True) or is dropped (False; None: ZEROBOOT_CHECKPOINT_SPILL_BEHIND, default: waits
        up to checkpoint_spill.WAIT_BOUND_S, then is dropped).
        checkpoint_policy: EVERY_CELL, or REQUESTED (chained cells get a checkpoint only when
        their execute asks for one).
        The spill file is created here, before the engine process's run-phase lockdown."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if files not in FILES_MODES:
            raise ValueError(f"files mode must be one of {FILES_MODES}, not {files!r}")
        if checkpoint_policy not in CHECKPOINT_POLICIES:
            raise ValueError(f"checkpoint policy must be one of {CHECKPOINT_POLICIES}, not {checkpoint_policy!r}")
        self.template = template
        self.mode = mode
        self.checkpoint_policy = checkpoint_policy
        self.keep = keep
        self.timeout = timeout
        self.interrupt_grace = interrupt_grace
        self.project_dir = os.path.realpath(project_dir) if project_dir else None
        self.project_root = (os.path.realpath(project_root) if project_root
                             else find_project_root(self.project_dir) if self.project_dir else None)
        if self.project_dir and self.project_root and \
                os.path.commonpath([self.project_dir, self.project_root]) != self.project_root:
            raise SandboxError(f"the project root {self.project_root} does not contain the notebook's folder "
                               f"{self.project_dir}")
        self.files = files
        self.host_writes_allowed = True  # False once the engine process is locked down (run phase)
        self.sandbox = template.fork()
        if self.project_dir and self.project_root:
            if self.project_dir in GUEST_PRIVATE_DIRS:
                raise SandboxError(
                    f"the notebook's folder is {self.project_dir}, where the sandbox keeps its own private "
                    f"{self.project_dir}: the notebook's files cannot be shown there. Move the notebook into a "
                    f"folder of its own (for example {self.project_dir.rstrip('/')}/work/) and open it from there")
            # the notebook's project at its own path, and the notebook's folder as the working
            # directory; credentials and histories in it (a home folder) hidden
            self.sandbox.guest.mount_project(self.project_root, files)
            self.sandbox.guest.project_hide(self.project_root, list(hidden))
            self.sandbox.guest.chdir(self.project_dir)
        # the kernel's environment and sys.path as ipykernel gives them, part of the clean state
        self.environ = session_environment() if environ is None else dict(environ)
        self.session_info = self.sandbox.start_session(self.environ, argv)
        # what "a fresh sandbox" means for this session: the template plus the notebook's folder
        self.clean = self.sandbox.snapshot()
        self.checkpoints: deque[Checkpoint] = deque()
        # chained mode: the state after the last cell, snapshotted while the kernel was still sending
        # that cell's reply (prepare_next_cell), to be the next cell's checkpoint; None when the state
        # has changed since, or nothing was prepared
        self.ready: Snapshot | None = None
        self.ready_ms = 0.0
        self.prepared_ns: tuple[int, int] | None = None  # when the last prepare_next_cell ran (tracing on only)
        # isolated mode: the sandbox was reset to the template after the last cell (prepare_next_cell)
        self.reset_done = False
        self.head: Snapshot | None = None   # chained state while isolated cells run
        self.running_fork: Sandbox | None = None  # the %%fanout run going on (fanout.py): interrupts go there
        self.timings: deque[dict[str, float]] = deque(maxlen=200)
        self.cells_run = 0
        self.rollbacks = 0
        self.released_pages = 0  # private page copies given back while idle (release_idle_memory)
        # the checkpoints' memory budget in bytes (given, else ZEROBOOT_CHECKPOINT_MEMORY); None: the
        # default, which follows the notebook's data (checkpoint_budget.default_budget)
        self.memory_budget = checkpoint_memory if checkpoint_memory is not None else budget.from_env()
        self.budget_dropped = 0             # checkpoints dropped to stay within the budget, this session
        self.budget_reason = ""             # why %rewind cannot go deeper now ("" when the budget did not limit it)
        self._budget_notices: list[str] = []  # for the user (budget, a crash between cells), printed (stderr) at the start of the next cell
        self._told_drop = self._told_over = self._told_spill = False
        # the cell running has no checkpoint of its own (_without_checkpoint, _unrequested): what a
        # crash rolls back to instead, and the sentence that says so; None while cells have their own
        self._fallback: tuple[Snapshot, str] | None = None
        self._told_without = ""  # why cells run without one, as last said (said once per reason)
        self.budget_spilled = 0             # checkpoints spilled to disk for the budget, this session
        self.idle_spilled = 0               # checkpoints spilled to disk while the session was idle
        self.spill: spill.SpillFile | None = None
        self.spill_reason = ""              # why there is no spill file ("" when there is one)
        # seconds a checkpoint that must leave memory waits for the spill writer (wait_from_env)
        self.spill_wait_s = spill.wait_from_env() if spill_waits is None else math.inf if spill_waits else 0.0
        self.spill_gaps = 0                 # checkpoints dropped because the spill writer was behind
        self._told_behind = False
        self._open_spill(checkpoint_disk)
        self._over = False                  # the last enforcement found the kept checkpoint alone over the budget
        self._predropped: list[int] = []    # checkpoints dropped just before the next one was taken (_checkpoint_now)
        # spills of checkpoints taken off the list while their write was in flight: their record's
        # space is freed once the write ends (_reap_spills)
        self._orphans: list[spill.PendingSpill] = []
        # (sandbox, its generation, bytes): an upper bound of checkpoint_memory(), valid while that
        # sandbox has taken no snapshot and made no restore since (_held_upper)
        self._held_bound: tuple[Sandbox, int, int] | None = None
        # checkpoints past `keep`, taken off the list before a cell and released after its reply
        # (prepare_next_cell): a release costs ~1 ms (up to 13 ms here) that the cell need not wait for
        self._retired: list[Snapshot] = []
        # the sandbox went back to an older state (rollback, %rewind, reset, mode, an isolated cell's
        # reset) since the kernel last asked (take_restored): its comms may differ from the frontend's
        self.restored = False

    def _open_spill(self, disk: int | None) -> None:
        try:
            limit = disk if disk is not None else spill.from_env()
            directory = spill.spill_dir(cache_root())
            if limit is None:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                limit = spill.default_disk_budget(directory)
            if limit <= 0:
                self.spill_reason = f"spilling to disk is off ({spill.ENV}=0 or no free disk space)"
                return
            self.spill = spill.SpillFile(directory, limit)
        except (OSError, budget.BudgetSyntaxError) as exc:
            self.spill_reason = f"no spill file: {exc}"
            log.warning("checkpoints will not be spilled to disk: %s", exc)

    # ---- cells ----
    def warm_up(self) -> None:
        """Before the first cell, once: the new sandbox's first request costs ~50 ms of shadow
        faults (Sandbox.warm_up), better paid while the kernel is still starting. It leaves no
        trace a cell can see; if it fails, the sandbox goes back to its clean state."""
        if self.cells_run:
            return
        try:
            # bounded whatever the cells' limit: the first request waits behind it
            self.sandbox.warm_up(timeout=WARM_UP_TIMEOUT)
        except SandboxError as exc:  # a crash, a timeout, memory: all of them
            log.warning("the sandbox's warm-up request failed (%s); starting from its clean state", exc)
            self.sandbox.restore(self.clean, fresh=True)

    def execute(self, code: str, *, execution_count: int, silent: bool = False, store_history: bool = True,
                user_expressions: dict[str, str] | None = None, on_stream: StreamCallback | None = None,
                on_message: MessageCallback | None = None, on_input: InputCallback | None = None,
                poll: Callable[[], None] | None = None, parent_header: dict[str, Any] | None = None,
                trace: dict[str, int] | None = None, wants_checkpoint: bool = True) -> dict[str, Any]:
        """Run one cell; returns the execute_reply content. Never raises for what the guest does.
        `trace` receives the cell's latency stamps (latency_trace.py), with those of the
        checkpoint taken after the previous cell's reply. `wants_checkpoint`: the cell asks for a
        checkpoint (only a REQUESTED policy reads it; EVERY_CELL gives every cell one)."""
        if trace is not None and self.prepared_ns is not None:
            trace["e_ckpt_start"], trace["e_ckpt_end"] = self.prepared_ns
        self.prepared_ns = None
        t0 = time.perf_counter()
        checkpoint, checkpoint_ms = self._before_cell(code, execution_count, wants_checkpoint)
        if self._budget_notices and on_stream and not silent:
            on_stream("stderr", "".join(self._budget_notices))
        self._budget_notices.clear()
        t1 = time.perf_counter()
        refusals = self._memory_refusals()
        try:
            r = self.sandbox.execute(code, on_stream=on_stream, on_message=on_message, on_input=on_input,
                                     timeout=self.timeout, silent=silent, store_history=store_history,
                                     user_expressions=user_expressions, execution_count=execution_count,
                                     interrupt_grace=self.interrupt_grace, poll=poll, parent_header=parent_header,
                                     trace=trace)
            reply = dict(r.reply)
            reply.setdefault("status", r.status)
            reply["execution_count"] = execution_count
            if r.status == "error" and r.error:
                reply.update({k: r.error.get(k) for k in ("ename", "evalue", "traceback")})
        except (SandboxCrashed, SandboxTimeout, SandboxMemoryError, SandboxError) as exc:
            reply = self._rollback(exc, checkpoint, execution_count, on_message)
        except Exception as exc:  # noqa: BLE001 - a host-side failure mid-cell: the guest is mid-request
            log.exception("cell %d failed on the host side; rolling the sandbox back", execution_count)
            reply = self._rollback(SandboxError(f"the host failed while serving this cell ({type(exc).__name__}: "
                                                f"{str(exc)[:300]})."), checkpoint, execution_count, on_message)
        self._say_memory_refusals(refusals, on_stream, silent)
        self.cells_run += 1
        self.timings.append({"checkpoint_ms": checkpoint_ms if checkpoint_ms is not None else (t1 - t0) * 1e3,
                             "execute_ms": (time.perf_counter() - t1) * 1e3})
        return reply

    def _memory_refusals(self) -> int:
        return int(self.sandbox.guest.stats()["family_refusals"])

    def _say_memory_refusals(self, before: int, on_stream: StreamCallback | None, silent: bool) -> None:
        """Forks or allocations of the cell's processes were refused because all processes of the
        sandbox share its one memory limit (issue 15): say so under the cell's OSError/MemoryError."""
        try:
            st = self.sandbox.guest.stats()
        except Exception:  # noqa: BLE001 - the sandbox was replaced by a rollback: nothing to say
            return
        refused = int(st["family_refusals"]) - before
        if refused <= 0 or not on_stream or silent:
            return
        limit = st["guest_pages_limit"] * 4096 >> 20
        on_stream("stderr", f"zeroboot: {refused} fork(s) or allocation(s) in this cell failed with ENOMEM: the "
                            f"sandbox's {limit} MiB memory limit is shared by all its processes, and each fork "
                            f"reserves the whole memory of the process it copies. Free memory, use fewer "
                            f"processes, or raise the limit with `%sandbox memory SIZE`.\n")

    def _before_cell(self, code: str, execution_count: int,
                     wants_checkpoint: bool = True) -> tuple[Snapshot, float | None]:
        """The snapshot the cell rolls back to, and what taking it cost (ms) if it was taken
        earlier (None: now, timed by the caller). `wants_checkpoint`: as in execute."""
        if self.mode == "isolated":
            taken_ms = self.ready_ms if self.reset_done else None
            if not self.reset_done:
                self.sandbox.restore(self.clean, fresh=True)
                self.restored = True
            self.reset_done = False
            return self.clean, taken_ms
        self._fallback = None
        if self.checkpoint_policy == REQUESTED and not wants_checkpoint:
            return self._unrequested(), 0.0
        try:
            snap, taken_ms = (self.ready, self.ready_ms) if self.ready is not None else (self._checkpoint_now(), None)
        except SandboxError as exc:
            guest = self.sandbox.guest
            if not guest.listeners_waiting() and not guest.fds_in_flight():
                raise
            return self._without_checkpoint(exc), 0.0
        self._told_without = ""
        self.ready = None
        self.checkpoints.append(Checkpoint(execution_count, code, snap, time.time()))
        self._release_retired()  # left from a cell after which prepare_next_cell did not run
        while len(self.checkpoints) > self.keep:
            self._forget(self.checkpoints.popleft(), retire=True)
        self._trim_gaps()
        if taken_ms is None:  # taken now: prepare_next_cell did not enforce the budget with it
            self.enforce_budget(protect=snap)
        return snap, taken_ms

    def _last_kept(self) -> tuple[Snapshot, str]:
        """What a cell without a checkpoint of its own rolls back to: the newest checkpoint in
        memory, else the clean sandbox; and how to name it."""
        last = next((cp for cp in reversed(self.checkpoints) if cp.snapshot is not None), None)
        if last is not None and last.snapshot is not None:
            return last.snapshot, f"the state before cell [{last.number}]"
        return self.clean, "the clean sandbox"

    def _unrequested(self) -> Snapshot:
        """REQUESTED policy, a cell that asked for no checkpoint (the batch run stops its notebook
        at this cell's error, so the state after a crash does not matter): it runs without one, and
        a crash or timeout rolls back to the last checkpoint there is."""
        target, where = self._last_kept()
        self._fallback = (target, f"This cell had no checkpoint of its own (a batch run takes them only before "
                                  f"cells whose errors let the notebook go on), so the sandbox was rolled back to "
                                  f"{where}: what the cells since then did is undone.")
        return target

    def _without_checkpoint(self, exc: SandboxError) -> Snapshot:
        """A connection waits in a listening socket's accept queue or fds are in flight, and
        snapshots of those are not supported yet: the cell runs without a checkpoint of its own,
        and a crash or timeout rolls back to the last checkpoint there is. Said once for as long
        as the same reason holds, not in every cell; a crash's message says where it went back to
        (_rollback). (Child processes do not stop checkpoints:
        a checkpoint holds process 1 and ends them when it is restored, lost_children_note.)"""
        target, where = self._last_kept()
        self._fallback = (target, f"This cell had no checkpoint of its own (a connection waiting on a listening "
                                  f"socket, or fds in flight, kept from an earlier cell), so the sandbox was "
                                  f"rolled back to {where}: what the cells since then did is undone.")
        if str(exc) != self._told_without:
            self._told_without = str(exc)
            self._budget_notices.append(f"zeroboot: this cell has no checkpoint of its own ({exc}); a crash or timeout "
                                        f"rolls back to {where}, and so do those of the next cells while this "
                                        f"lasts (not said again). {_ENDING_HELPERS}\n")
        return target

    def prepare_next_cell(self) -> None:
        """Do now, between cells, what the next cell would do first: in chained mode snapshot the
        state as its checkpoint (EVERY_CELL policy; REQUESTED takes one when a cell asks), in
        isolated mode reset the sandbox to the template. The engine server calls this right after
        sending a cell's reply, so the work is done while the kernel publishes the reply and the
        frontend sends the next request, not on the next cell's round trip. Everything else that
        changes the sandbox undoes it (_state_changes)."""
        t0 = time.perf_counter()
        started_ns = latency_trace.now() if latency_trace.ENABLED else 0
        self._reap_spills()
        try:
            if self.mode == "isolated" and not self.reset_done:
                self.sandbox.restore(self.clean, fresh=True)
                self.reset_done = True
                self.restored = True
            elif self.mode == "chained" and self.checkpoint_policy == EVERY_CELL and self.ready is None \
                    and not self.sandbox.broken:
                self.ready = self._checkpoint_now()  # releases the retired checkpoints first
                self.enforce_budget(protect=self.ready)
            else:
                return
        except SandboxError as exc:  # the next cell does it again and reports it
            log.warning("could not prepare the next cell: %s", exc)
            return
        finally:
            self._release_retired()  # what _checkpoint_now did not release (other modes, errors)
        self.ready_ms = (time.perf_counter() - t0) * 1e3
        if latency_trace.ENABLED:
            self.prepared_ns = (started_ns, latency_trace.now())

    def _forget(self, cp: Checkpoint, *, retire: bool = False) -> None:
        """Let go of a checkpoint taken off the list: its memory (retire: after the next reply,
        _release_retired) or its record in the spill file."""
        if cp.snapshot is not None:
            if retire:
                self._retired.append(cp.snapshot)
            else:
                cp.snapshot.release()  # a spill in flight holds the snapshot itself (its job)
            cp.snapshot = None
        if cp.writing is not None:  # its record is freed once the write has ended (_reap_spills)
            self._orphans.append(cp.writing)
            cp.writing = None
            cp.spilled = None
        if cp.spilled is not None:
            if self.spill is not None:
                self.spill.free(cp.spilled)
            cp.spilled = None

    def _memory_size(self) -> int:
        return os.stat(os.path.join(str(self.template.directory), "memory.img")).st_size

    def _release_retired(self) -> None:
        """Release the checkpoints _before_cell took off the list (past `keep`)."""
        while self._retired:
            self._retired.pop().release()

    def release_idle_memory(self) -> int:
        """While the notebook is idle: give back the host's private copies of the sandbox's pages
        that hold the template's bytes again (Guest.release_template_copies; a cell writes ~1,000
        pages and most end as they were, CPython's reference counts going up and back down), and
        the memory the guest freed that is kept mapped for reuse (Guest.release_freed: the arrays
        and frames a data-heavy cell replaced, up to half of guest memory). The guest's state is
        unchanged, so every checkpoint, rollback and %rewind stays as it was; the next cell pays a
        host fault for each of those pages it writes again, and its next big allocations get fresh
        pages. Not while threads of user code may run (the guest runs between requests then).
        Also gives back the memory of freed sandboxes (child processes, an earlier session) that
        the engine keeps for its next fork (Engine.release_parked). Returns the pages given back
        from the session's own sandbox."""
        self.sandbox.guest.engine.release_parked()
        give_back_dead_store_pages()  # dead checkpoint pages waiting for a batch (zb_snapshot_give_back_dead)
        if self.sandbox.broken or self.runs_between_cells():
            return 0
        try:
            n = self.sandbox.guest.release_freed() + self.sandbox.guest.release_template_copies()
        except SandboxError as exc:  # only memory is at stake: say so, and go on
            log.warning("could not give back the idle sandbox's unchanged pages: %s", exc)
            return 0
        self.released_pages += n
        self.spill_idle_checkpoints()
        return n

    def spill_idle_checkpoints(self) -> int:
        """While the notebook is idle: start writing the %rewind checkpoints still in memory to the
        spill file, oldest first, as the budget does when it is exceeded, so that an idle session
        holds only what a rollback needs (the next cell's checkpoint). Their memory goes once the
        writes end (the engine server reaps them between requests); %rewind reads them back from
        disk. Nothing is dropped for it: it stops where the spill file is full, the writer has
        enough in flight (_writing_cap), or there is no spill file. Returns how many it started."""
        if self.spill is None or self.mode != "chained":
            return 0
        protect = self._rollback_target()
        kept = {id(s) for s in self._kept(protect)}
        started = 0
        for cp in list(self.checkpoints):
            if cp.snapshot is None or cp.writing is not None or id(cp.snapshot) in kept:
                continue
            if self._spill_out(cp, [], idle=True) != "spilled":
                break
            started += 1
        if started:
            log.info("idle: spilling %d checkpoint(s) to disk", started)
        return started

    def runs_between_cells(self) -> bool:
        """Threads of user code are alive in the chained sandbox, or the agent's asyncio loop has
        tasks or timers (between_cells has work: isolated mode resets after the reply, which ends
        them)."""
        return (self.mode == "chained" and not self.sandbox.broken
                and (self.sandbox.waits_timed or self.sandbox.threads_alive() > 1))

    def between_cells(self, request_waiting: Callable[[], bool]) -> None:
        """What the engine server does after a reply until the next request: prepare the next cell
        (prepare_next_cell) and, in chained mode with threads of user code alive or asyncio tasks
        and timers pending in the agent's loop, keep them running as ipykernel does
        (Sandbox.run_between_requests) until a request arrives (request_waiting) or none can run
        by itself. The prepared checkpoint is the state at the reply; if guest code ran since, it
        is not the state at the next cell's start any more: it is dropped, and retaken when the
        guest went idle (no request waiting yet), else the next cell takes its own at its start. A crash of a thread meanwhile rolls the last cell back, told at the start of
        the next cell (_rollback_between_cells)."""
        if not self.runs_between_cells():
            return
        self.prepare_next_cell()
        if self.ready is None and self.checkpoint_policy == EVERY_CELL:
            return  # could not be taken (the next cell tries again and says why)
        try:
            done = self.sandbox.run_between_requests(request_waiting)
        except SandboxError as exc:
            self._rollback_between_cells(exc)
            return
        if not done.ran:
            return  # only the agent's read ran: the prepared checkpoint is the state still
        self._state_changes()
        if done.outcome == "idle":
            self.prepare_next_cell()

    def _rollback_between_cells(self, exc: SandboxError) -> None:
        """A thread or an asyncio task crashed the sandbox (or broke the channel) after the last
        cell's reply. Under ipykernel the kernel would die; here the last cell is rolled back, as a
        crash in a thread during the cell rolls it back: the state at its reply would hold the same
        thread or task, about to crash again. Told on stderr at the start of the next cell."""
        self.rollbacks += 1
        self.restored = True
        self._state_changes()  # the prepared checkpoint holds the thread about to crash: dropped
        cp = self.checkpoints.pop() if self.checkpoints else None
        target = None
        if cp is not None:
            try:
                target = self._materialize(cp)
            except SandboxError as bad:  # a spilled one that cannot be read: the clean state then
                log.warning("%s", bad)
                cp = None
        self.sandbox.restore(target if target is not None else self.clean, fresh=target is None)
        lost = lost_children_note(target) if target is not None else ""  # (before it is let go, below)
        what = f"its state before cell [{cp.number}]" if cp is not None else "a clean sandbox"
        if cp is not None:
            if cp.snapshot is None and target is not None:
                target.release()
            self._forget(cp)
        self._budget_notices.append(f"[zeroboot] a background thread or asyncio task crashed the sandbox after the last cell ended ({exc}); "
                                    f"the sandbox was rolled back to {what}.{lost}\n")
        log.warning("a thread or task crashed the sandbox between cells: %s", exc)

    def _state_changes(self) -> None:
        """The sandbox is about to change outside a cell: what prepare_next_cell did no longer holds."""
        self.reset_done = False
        if self.ready is not None:
            self.ready.release()
            self.ready = None

    def _rollback(self, exc: Exception, checkpoint: Snapshot, execution_count: int,
                  on_message: MessageCallback | None) -> dict[str, Any]:
        ename = type(exc).__name__
        self.sandbox.restore(checkpoint, fresh=checkpoint is self.clean)
        lost = lost_children_note(checkpoint)  # (before the checkpoint is let go, below)
        self.rollbacks += 1
        self.restored = True
        if self.mode == "chained" and self.checkpoints and self.checkpoints[-1].snapshot is checkpoint:
            self._forget(self.checkpoints.pop())  # the cell is undone: nothing to rewind to
        if self._fallback is not None and self._fallback[0] is checkpoint:
            what = self._fallback[1]  # the cell had no checkpoint of its own: further back
        elif self.mode == "chained":
            what = "The sandbox was rolled back to its state before this cell; variables from earlier cells are intact."
        else:
            what = "The next cell starts from a clean sandbox as usual."
        self._fallback = None
        evalue = f"{exc} {what}{lost}"
        content = {"ename": ename, "evalue": evalue, "traceback": [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]}
        if on_message:
            on_message("error", content)
        return {"status": "error", "execution_count": execution_count, "user_expressions": {}, "payload": [], **content}

    # ---- state ----
    def rewind(self, n: int = 1) -> str:
        """Go back to the state before the last n cells (chained mode)."""
        if self.mode != "chained":
            raise SandboxError("%rewind works in chained mode; in isolated mode every cell starts clean")
        if n < 1:
            raise SandboxError("%rewind N needs N >= 1")
        if n > len(self.checkpoints):
            why = f" ({self.budget_reason})" if self.budget_reason else ""
            raise SandboxError(f"only {len(self.checkpoints)} checkpoint(s) are kept{why}; cannot rewind {n} cells "
                               f"(`%sandbox checkpoints` lists them)")
        target = self.checkpoints[-n]
        if target.dropped:
            raise SandboxError(f"the checkpoint before cell [{target.number}] was dropped: {target.dropped}. "
                               f"%rewind {self._reachable_text()} (`%sandbox checkpoints` lists them)")
        from_disk = target.snapshot is None
        t0 = time.perf_counter()
        snap = self._materialize(target)  # before anything changes: a corrupt spill leaves the state as it is
        self._state_changes()
        for _ in range(n - 1):
            self._forget(self.checkpoints.pop())
        self.checkpoints.pop()
        lost = lost_children_note(snap)
        try:
            self.sandbox.restore(snap)
        finally:
            self.restored = True
            if from_disk:
                snap.release()
            self._forget(target)
        lost = f".{lost}" if lost else ""
        if from_disk:
            return (f"rewound {n} cell(s): state as before cell [{target.number}] (read back from disk in "
                    f"{time.perf_counter() - t0:.2f} s){lost}")
        return f"rewound {n} cell(s): state as before cell [{target.number}]{lost}"

    def _materialize(self, cp: Checkpoint) -> Snapshot:
        """The checkpoint's snapshot: its own (released by _forget), or a spilled one read back from
        disk (the caller releases it once restored). A spilled one that cannot be read back is taken
        off the list and a SandboxError says why."""
        if cp.snapshot is not None:
            return cp.snapshot
        if self.spill is None or cp.spilled is None:
            raise SandboxError(f"the checkpoint before cell [{cp.number}] is neither in memory nor on disk")
        try:
            return self.spill.load(cp.spilled, self.clean, self._memory_size())
        except (spill.SpillError, SandboxError) as exc:
            self._leave_gap(cp, f"its copy on disk could not be read back ({exc})")
            self._trim_gaps()
            raise SandboxError(f"the checkpoint before cell [{cp.number}] was spilled to disk and cannot be read "
                               f"back: {exc}. It was dropped; nothing changed in the sandbox, and %rewind "
                               f"{self._reachable_text()} (`%sandbox checkpoints` lists them)") from None

    def _reachable_text(self) -> str:
        """How far %rewind can go, for messages: "can still go back 1 to 4 cells" or "... 1, 2 or 7 cells"."""
        ns = self._reachable()
        if not ns:
            return "cannot go back to any checkpoint now"
        if ns == list(range(1, len(ns) + 1)):
            return f"can still go back 1 to {ns[-1]} cells" if len(ns) > 1 else "can still go back 1 cell"
        shown = ", ".join(str(n) for n in ns[:-1][:11]) + (", ..." if len(ns) > 12 else "")
        return f"can still go back {shown} or {ns[-1]} cells"

    def set_mode(self, mode: str) -> str:
        if mode not in MODES:
            raise SandboxError(f"unknown mode {mode!r}: use chained or isolated")
        if mode == self.mode:
            return f"already in {mode} mode"
        self._state_changes()
        self.restored = True
        if mode == "isolated":
            self.head = self.sandbox.checkpoint()       # keep the chained state for coming back
        else:
            if self.head is not None:
                self.sandbox.restore(self.head)
                self.head.release()
                self.head = None
            else:
                self.sandbox.restore(self.clean, fresh=True)
        self.mode = mode
        return f"{mode} mode: " + ("every cell runs in a fresh sandbox forked from the template"
                                   if mode == "isolated" else "each cell continues from the previous one")

    def _drop_history(self) -> None:
        """Forget every checkpoint and the head (restart, replace_with): the state changes wholesale."""
        self._state_changes()
        for cp in self.checkpoints:
            self._forget(cp)
        self.checkpoints.clear()
        self.budget_reason = ""
        self._over = False
        if self.head is not None:
            self.head.release()
            self.head = None

    def restart(self) -> None:
        """Back to the clean template, dropping all checkpoints (instant: a restore)."""
        self._drop_history()
        self.sandbox.restore(self.clean, fresh=True)
        self.restored = True

    # ---- comms: the frontend's messages, between cells ----
    def comm(self, message: dict[str, Any], buffers: list[bytes], *, on_stream: StreamCallback | None = None,
             on_message: MessageCallback | None = None, poll: Callable[[], None] | None = None) -> dict[str, Any]:
        """A frontend comm message (a widget moved, a button clicked) runs in the live sandbox like
        a small cell, under the cell timeout and interrupts. Chained mode: it starts from the state
        the next cell's checkpoint holds (taken now if it was not prepared), and a crash, a timeout
        or an ignored interrupt in its callbacks rolls back that message only, reported as an
        error; what it changed is part of the next cell's checkpoint, and it is no %rewind step of
        its own. Isolated mode: the sandbox was reset after the cell that made the widget, so the
        message is not delivered (`delivered`: false); the kernel closes the frontend's comms."""
        if self.mode == "isolated":
            return {"status": "ok", "delivered": False}
        try:
            snap = self.ready if self.ready is not None else self.sandbox.checkpoint()
        except SandboxError as exc:
            return {"status": "error", "delivered": False, "ename": type(exc).__name__, "evalue": str(exc),
                    "traceback": []}
        self.ready = None
        try:
            reply = self.sandbox.comm(message, buffers, on_stream=on_stream, on_message=on_message,
                                      timeout=self.timeout, interrupt_grace=self.interrupt_grace, poll=poll)
        except (SandboxCrashed, SandboxTimeout, SandboxMemoryError, SandboxError) as exc:
            return self._comm_rollback(exc, snap, on_message)
        except Exception as exc:  # noqa: BLE001 - a host-side failure mid-message: the guest is mid-request
            log.exception("a comm message failed on the host side; rolling the sandbox back")
            return self._comm_rollback(SandboxError(f"the host failed while serving a widget message "
                                                    f"({type(exc).__name__}: {str(exc)[:300]})."), snap, on_message)
        snap.release()  # the state moved on; prepare_next_cell takes the next checkpoint
        return {"status": "ok" if reply.get("status") == "ok" else "error", "delivered": True}

    def _comm_rollback(self, exc: Exception, snap: Snapshot, on_message: MessageCallback | None) -> dict[str, Any]:
        self.sandbox.restore(snap)
        self.ready = snap  # the state is the prepared checkpoint's again
        self.rollbacks += 1
        self.restored = True
        ename = type(exc).__name__
        evalue = (f"{exc} The sandbox was rolled back to its state before this widget message; variables and "
                  f"widgets from earlier cells are intact.{lost_children_note(snap)}")
        content = {"ename": ename, "evalue": evalue, "traceback": [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]}
        if on_message:
            on_message("error", content)
        return {"status": "error", "delivered": True, **content}

    def comm_info(self, target_name: str | None = None, sync: list[str] | None = None,
                  on_message: MessageCallback | None = None) -> dict[str, dict[str, str]]:
        """The guest's comm registry (comm_info_request); with `sync`, resynchronised first
        (Sandbox.comm_info). Changes no checkpoint: a resync after a restore only makes the
        guest agree with the frontend, and the next checkpoint is taken after it."""
        if self.sandbox.broken:
            return {}
        if sync is not None:
            self._state_changes()
        return self.sandbox.comm_info(target_name, sync, on_message)

    def take_restored(self) -> bool:
        restored, self.restored = self.restored, False
        return restored

    # ---- session saves (session_save.py) ----
    def snapshot_for_save(self) -> tuple[Snapshot, bool]:
        """The session's current state, to save, and whether the caller owns (releases) it: in
        isolated mode the chained state kept aside, else a snapshot of the live sandbox."""
        if self.mode == "isolated":
            return (self.head if self.head is not None else self.clean), False
        return self.sandbox.snapshot(), True

    def replace_with(self, snap: Snapshot) -> None:
        """Continue from snap (a resumed save, of its own memory image): every checkpoint goes, and
        snap becomes the clean state `%sandbox reset` and isolated cells return to. Takes snap."""
        try:
            new = Sandbox(snap.fork(), self.template, fresh=False)
        except BaseException:
            snap.release()
            raise
        self._drop_history()
        new.memory_limit = self.sandbox.memory_limit
        if new.memory_limit:
            new.guest.set_memory_limit(new.memory_limit)
        new.execution_count = self.sandbox.execution_count
        self.sandbox.close()
        self.clean.release()
        self.sandbox, self.clean = new, snap  # isolated mode: head None, so chained mode returns to snap

    # ---- requests that must not change the state ----
    def _throwaway(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        isolated = self.mode == "isolated"
        if not isolated and self.sandbox.guest.child_processes():
            # a restore would end the child processes (a checkpoint holds process 1 only): with
            # children the request runs on the live state, as under ipykernel
            try:
                return fn()
            except (SandboxCrashed, SandboxTimeout, SandboxMemoryError) as exc:
                if self.ready is not None:  # back to the state after the last cell (its children end)
                    self.sandbox.restore(self.ready)
                    self.restored = True
                else:
                    self._rollback_between_cells(exc)
                return {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
            except SandboxError as exc:
                log.warning("request failed in the sandbox: %s", exc)
                return {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        snap = self.clean if isolated else self.ready or self.sandbox.checkpoint()
        self.reset_done = False  # until the state is the template's again, below
        try:
            if isolated:
                self.sandbox.restore(snap, fresh=True)
            return fn()
        except SandboxError as exc:
            log.warning("request failed in the sandbox: %s", exc)
            return {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        finally:
            self.sandbox.restore(snap, fresh=isolated)
            self.reset_done = isolated
            if snap is not self.clean and snap is not self.ready:
                snap.release()

    def complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        return self._throwaway(lambda: self.sandbox.complete(code, cursor_pos))

    def inspect(self, code: str, cursor_pos: int, detail_level: int = 0) -> dict[str, Any]:
        return self._throwaway(lambda: self.sandbox.inspect(code, cursor_pos, detail_level))

    # ---- memory ----
    def set_memory(self, size: int) -> str:
        """%sandbox memory SIZE: the guest's memory limit from now on (up to the template's size)."""
        total = int(self.template.manifest.get("memory") or 0)
        if size > total:
            raise SandboxError(f"this sandbox's memory is {describe(total)} (its template's size); for more, set "
                               f"ZEROBOOT_MEMORY={max(size, total) // (1 << 30) + 1}G in the kernelspec's env and "
                               f"restart the kernel (a template of that size is built once)")
        st = self.sandbox.guest.stats()
        used = st["guest_pages"] * 4096
        if size < used:
            raise SandboxError(f"the sandbox already uses {describe(used)}; give a limit above that")
        self._state_changes()
        self.sandbox.memory_limit = size if size < total else 0
        self.sandbox.guest.set_memory_limit(size)
        return f"sandbox memory limit: {describe(size)} (of {describe(total)}; {describe(used)} in use)"

    # ---- the notebook's files ----
    def _need_project(self) -> str:
        if not self.project_dir:
            raise SandboxError("this session has no notebook directory mounted")
        return self.project_dir

    def set_files(self, files: str) -> str:
        """%sandbox files MODE: how the notebook's folder is seen from now on."""
        directory = self._need_project()
        if files not in FILES_MODES:
            raise SandboxError(f"unknown files mode {files!r}: use overlay, readonly or readwrite")
        if files == "readwrite" and not self.host_writes_allowed:
            raise SandboxError("readwrite must be chosen when the kernel starts (ZEROBOOT_FILES=readwrite in the "
                               "kernelspec's env): the sandbox engine process is locked down against writing "
                               "host files")
        root = self.project_root or directory
        self._state_changes()
        self.sandbox.guest.set_project_mode(root, files)
        self.files = files
        return {"overlay": f"{root}: reads from the host, writes stay private to the sandbox",
                "readonly": f"{root}: read-only (writes fail with EROFS)",
                "readwrite": f"{root}: writes go to the host (inside this folder only)"}[files]

    def diff(self) -> list[tuple[str, str]]:
        """What the sandbox created (A), changed (M) or deleted (D) in the notebook's project
        (paths relative to the project root; tags of zeroboot_kernel.listing; "!" marks a directory
        too deep to list)."""
        project_dir = self._need_project()
        return self.sandbox.guest.project_diff(self.project_root or project_dir)

    def _export_source(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self._need_project(), path)

    def export_plan(self, path: str) -> list[export.PlanEntry]:
        """What %sandbox export PATH would write: the tree at PATH as the sandbox sees it, with
        file sizes (export.plan); the data is read in chunks with export_chunk."""
        return export.plan(self.sandbox.guest, self._export_source(path))

    def export_chunk(self, path: str, parts: tuple[str, ...], offset: int, size: int) -> bytes:
        return export.read_chunk(self.sandbox.guest, self._export_source(path), parts, offset, size)

    def export(self, path: str, dest: str | None = None) -> str:
        """Copy a file or folder as the sandbox sees it into the notebook's folder on the host
        (in-process use; the kernel writes on its side with export.write)."""
        report = export.write(self.export_plan(path), lambda parts, off, n: self.export_chunk(path, parts, off, n),
                              dest or path, self._need_project())
        return export.format_report(path, report)

    # ---- the checkpoints' memory budget ----
    def _held_snapshots(self) -> list[Snapshot]:
        # a checkpoint being spilled is counted as gone (its memory is given back when the write ends,
        # and what is in flight is bounded: _writing_cap); writing_bytes() says how much that is
        held = [cp.snapshot for cp in self.checkpoints if cp.snapshot is not None and cp.writing is None] + [self.clean]
        return held + [s for s in (self.ready, self.head) if s is not None]

    def _rollback_target(self) -> Snapshot | None:
        """The snapshot the next cell rolls back to: the prepared checkpoint, else the newest one."""
        return self.ready if self.ready is not None else (self.checkpoints[-1].snapshot if self.checkpoints else None)

    def _kept(self, protect: Snapshot | None) -> list[Snapshot]:
        """The snapshots no drop or spill may take: the clean state, the next cell's, the head, protect."""
        return [self.clean] + [s for s in (self.ready, self.head, protect) if s is not None]

    def checkpoint_memory(self) -> int:
        """Bytes of host memory the session's snapshots hold (checkpoints, the next cell's, the clean state)."""
        return snapshots_memory(self._held_snapshots())

    def _held_upper(self) -> int:
        """checkpoint_memory() or, when the last checkpoint recorded one that still holds, an upper
        bound of it. The exact count walks every held snapshot's page tables (zb_snapshots_memory,
        ~1-2.5 ms per call here with 20 checkpoints); the bound lets a chained cell whose checkpoints
        are well within their budget skip both walks of its checkpoint (issue 20)."""
        b = self._held_bound
        if b is not None and b[0] is self.sandbox and b[1] == self.sandbox.generation:
            return b[2]
        return self.checkpoint_memory()

    def budget_bytes(self) -> int:
        if self.memory_budget is not None:
            return self.memory_budget
        return budget.default_budget(self.sandbox.guest.stats()["guest_pages"] * 4096)

    def set_budget(self, size: int | None) -> str:
        """%sandbox checkpoints budget SIZE|auto: set the budget and apply it now."""
        if size is not None and size < 0:
            raise SandboxError("the checkpoint memory budget must be >= 0")
        self.memory_budget = size
        self.budget_reason = ""
        protect = self._rollback_target()
        self.enforce_budget(protect=protect, notify=False)
        return self.describe_budget()["summary"]

    def _checkpoint_now(self) -> Snapshot:
        """Snapshot the sandbox as the next checkpoint. The oldest checkpoints that the budget would
        drop once it exists (enforce_budget, called after this) are dropped just before it instead,
        and the engine writes its pages into the store pages they gave up, which costs about a
        third of fresh ones (zb_snapshot_keep_spare). Crash rollback is unaffected: the cell that
        just ended needs no checkpoint any more, and the next one runs only once this one exists
        (or takes its own, _before_cell)."""
        incoming = self.sandbox.guest.pending_bytes()
        keep_spare_pages(True)
        try:
            # The checkpoint that fell past `keep` and finished spills give their pages back now:
            # this snapshot writes into them (a chained `1+1` cell's checkpoint stores ~360 pages
            # and the retired one gives back about as many; 5.4 -> 4.5 ms per checkpoint in
            # `bench kernel`, what fresh shmem pages and punching out the old ones cost).
            self._release_retired()
            self._reap_spills()
            limit, held = self.budget_bytes(), self._held_upper()
            fits = held + incoming <= limit
            if not fits:  # maybe over: decided on the exact count, as before
                self._predropped += self._drop_oldest(limit, None, incoming)
            snap = self.sandbox.checkpoint()
        finally:
            keep_spare_pages(False)
        # The new snapshot adds at most `incoming` bytes (the pages it copied) to what the held
        # snapshots count, as long as the state it shares its other pages with is held too: the
        # previous checkpoint, which this sandbox's memory is based on since nothing was snapshotted
        # or restored in between (the bound was recorded at that snapshot, and the generation
        # says), and which no drop released (none happened: `fits`; keep >= 1 keeps the newest).
        self._held_bound = (self.sandbox, self.sandbox.generation, held + incoming) if fits and self.keep >= 1 else None
        return snap

    def _drop_oldest(self, limit: int, protect: Snapshot | None, incoming: int = 0) -> list[int]:
        """Drop the oldest checkpoints while the snapshots held, plus `incoming` bytes about to be
        added, exceed `limit`; never `protect`, and nothing once what is droppable adds almost
        nothing (see enforce_budget). Returns the dropped checkpoints' cell numbers (not those left
        as gaps, spill_gaps counts them)."""
        held = self.checkpoint_memory()
        if held + incoming <= limit:
            return []
        kept = self._kept(protect)
        floor = snapshots_memory(kept)          # what no drop can free
        slack = max(budget.MIB, limit // 32)    # history that adds less than this is not worth dropping
        dropped: list[int] = []
        while held + incoming > limit and held - floor > slack:
            # the oldest checkpoint still in memory (the spilled ones and the one being spilled are older)
            cp = next((c for c in self.checkpoints if c.snapshot is not None and c.writing is None), None)
            if cp is None or cp.snapshot is protect:
                break
            outcome = self._spill_out(cp, dropped)
            if outcome == "behind":  # a gap, not a drop: every other checkpoint keeps its depth (own notice)
                self._leave_gap(cp, "the disk writer was still busy with an earlier checkpoint (the cells came "
                                    "faster than their checkpoints could be written)")
                self.spill_gaps += 1
            elif outcome == "no":
                self.checkpoints.remove(cp)
                self._forget(cp)
                dropped.append(cp.number)
            held = self.checkpoint_memory()
        self._trim_gaps()
        return dropped

    def _leave_gap(self, cp: Checkpoint, why: str) -> None:
        """Let go of a checkpoint but keep its place in the list, so that %rewind N still means the
        same cell for every other checkpoint; %rewind to it is refused, saying `why`."""
        self._forget(cp)
        cp.dropped = why

    def _trim_gaps(self) -> None:
        """The oldest entries that are gaps lead to nothing: take them off the list."""
        while self.checkpoints and self.checkpoints[0].dropped:
            self.checkpoints.popleft()

    def _reachable(self) -> list[int]:
        """The N for which %rewind N works, smallest first."""
        return [n for n, cp in zip(range(len(self.checkpoints), 0, -1), self.checkpoints) if not cp.dropped][::-1]

    def _spill_out(self, cp: Checkpoint, dropped: list[int], *, idle: bool = False) -> str:
        """Start moving a checkpoint's memory to the spill file (checkpoint_spill.py), making room
        there by dropping the oldest spilled checkpoints (their numbers go to `dropped`). The spill
        writer writes it while the session goes on; its snapshot is released when the write is done
        (_reap_spills). Writes in flight hold at most _writing_cap() bytes: one that would go over
        waits here for those before it up to spill_wait_s, else it is not written ("behind": the
        caller drops it and leaves a gap, so the next cell never waits for the disk). "spilled" when
        the write started; "no" when there is no spill file, it is larger than the whole disk
        budget, or it cannot start: then it is dropped. idle (spill_idle_checkpoints): never waits
        and never drops a spilled checkpoint to make room ("behind" or "no" then; the caller keeps
        the checkpoint in memory)."""
        if self.spill is None or cp.snapshot is None or cp.writing is not None:
            return "no"
        self._reap_spills()
        job = None
        try:
            job = cp.snapshot.spill_job()
            raw = job.state_len + job.pages_len
            if self.writing_bytes() and self.writing_bytes() + raw > self._writing_cap() \
                    and (idle or not self._writer_caught_up(raw)):
                job.free()
                return "behind"
            length = spill.aligned_length(job.state_len, job.records, job.stored)
            if spill.span(length) > self.spill.limit:
                self.spill_reason = (f"a checkpoint of {budget.mib(raw)} is larger than the whole disk budget "
                                     f"({budget.mib(self.spill.limit)}, {spill.ENV})")
                job.free()
                return "no"
            if idle and not self.spill.fits(length):
                job.free()
                return "no"
            while not self.spill.fits(length) and self.checkpoints and self.checkpoints[0].snapshot is None:
                old = self.checkpoints.popleft()
                self._forget(old)
                dropped.append(old.number)
            ref = self.spill.reserve(job.state_len, job.records, job.stored)
        except (spill.SpillError, SandboxError, OSError) as exc:
            if job is not None:
                job.free()
            log.warning("could not spill the checkpoint before cell [%d] to disk: %s", cp.number, exc)
            self.spill_reason = f"spilling failed: {exc}"
            return "no"
        cp.spilled = ref
        cp.writing = spill.PendingSpill(job, ref, self.spill.fd, self.spill.direct_fd,
                                        self.spill.head(ref, job.state_len, job.records, job.stored), self.spill.key)
        spill.WRITER.submit(cp.writing)
        if idle:  # not the budget's doing: counted apart, and no notice about the budget
            self.idle_spilled += 1
            return "spilled"
        self.budget_spilled += 1
        if not self._told_spill:
            self._told_spill = True
            self._budget_notices.append(
                f"[zeroboot] checkpoints hold more memory than their budget: the oldest are written to disk "
                f"(a file of this session, removed when it ends; disk budget {budget.mib(self.spill.limit)}, "
                f"{spill.ENV}) and %rewind reads them back. `%sandbox checkpoints` shows where each is. "
                f"(Told once per session.)\n")
        return "spilled"

    def _writer_caught_up(self, raw: int) -> bool:
        """Wait up to spill_wait_s for the writes in flight (they hold memory until they end, so
        what is in flight is bounded); whether a checkpoint of raw bytes can be written now."""
        if self.spill_wait_s <= 0:
            return False
        if math.isinf(self.spill_wait_s):
            self._reap_spills(wait=True)
            return True
        deadline = time.monotonic() + self.spill_wait_s
        for cp in self.checkpoints:
            if cp.writing is not None and not cp.writing.done.wait(max(0.0, deadline - time.monotonic())):
                break
        self._reap_spills()
        return not self.writing_bytes() or self.writing_bytes() + raw <= self._writing_cap()

    def _reap_spills(self, wait: bool = False) -> None:
        """Take the results of the spill writer (on the session's thread, which alone touches
        snapshots): a finished write releases its checkpoint's memory and makes its record readable;
        a failed one drops the checkpoint; an orphan's record is freed. wait: until none is in flight."""
        for cp in list(self.checkpoints):
            p = cp.writing
            if p is None or not (p.done.is_set() or (wait and p.done.wait())):
                continue
            cp.writing = None
            p.job.free()
            if p.error:
                log.warning("could not spill the checkpoint before cell [%d] to disk: %s", cp.number, p.error)
                self.spill_reason = f"spilling failed: {p.error}"
                self.checkpoints.remove(cp)
                self._forget(cp)
                self.budget_dropped += 1
                self.budget_reason = self._dropped_reason(self.budget_bytes())
                continue
            p.ref.pending = False
            p.ref.write_s = p.seconds
            if cp.snapshot is not None:
                cp.snapshot.release()
                cp.snapshot = None
            log.info("spilled the checkpoint before cell [%d]: %d bytes in %.3f s", cp.number, p.ref.length, p.seconds)
        for p in list(self._orphans):
            if p.done.is_set() or (wait and p.done.wait()):
                self._orphans.remove(p)
                p.job.free()
                if self.spill is not None:
                    self.spill.free(p.ref)

    def spills_writing(self) -> bool:
        """Spills in flight whose end would release memory (Session.reap_spills)."""
        return bool(self._orphans) or any(cp.writing is not None for cp in self.checkpoints)

    def reap_spills(self) -> None:
        """Between requests (the engine server, while spills_writing()): release the memory of the
        checkpoints whose write has ended."""
        self._reap_spills()

    def _writing_cap(self) -> int:
        """At most this many bytes of checkpoints are being written at once (beyond one checkpoint):
        half the budget, at least 64 MiB. They are held in memory until their write ends, so while
        spills are in flight the snapshots hold at most the budget plus this."""
        return max(64 * budget.MIB, self.budget_bytes() // 2)

    def writing_bytes(self) -> int:
        """Bytes of checkpoints being written to disk (held in memory until the write ends)."""
        return sum(cp.spilled.raw_bytes for cp in self.checkpoints if cp.writing is not None and cp.spilled is not None)

    def enforce_budget(self, protect: Snapshot | None, *, notify: bool = True) -> int:
        """Drop the oldest checkpoints while the session's snapshots hold more than the budget.
        `protect` (the snapshot the running or next cell rolls back to) is never dropped, and neither
        is anything when the droppable checkpoints add almost nothing (they share their pages with
        the kept one: dropping them would cost %rewind depth and free no memory). Returns how many
        were dropped."""
        limit, held = self.budget_bytes(), self._held_upper()
        predropped, self._predropped = self._predropped, []  # dropped for this checkpoint just before it
        if notify:
            self._say_gaps()
        if held > limit or predropped:
            held = self.checkpoint_memory()  # decided on the exact count, as before
        if held <= limit and not predropped:
            if self._over:  # no longer over: what limits %rewind now is what was dropped, if anything
                self._over = False
                self.budget_reason = self._dropped_reason(limit) if self.budget_dropped else ""
            return 0
        kept = self._kept(protect)
        floor = snapshots_memory(kept)          # what no drop can free
        dropped = predropped + self._drop_oldest(limit, protect)
        held = self.checkpoint_memory()
        self.budget_dropped += len(dropped)
        if dropped:
            self.budget_reason = self._dropped_reason(limit)
        over = self._over = floor > limit
        if over:
            self.budget_reason = (f"the checkpoint a crash rolls back to holds {budget.mib(floor)} on its own (the "
                                  f"notebook's changed data), more than the budget of {budget.mib(limit)}: it is kept "
                                  f"anyway, and older checkpoints only while they add little "
                                  f"({budget.mib(held - floor)} now)")
        if notify and dropped and not self._told_drop:
            self._told_drop = True
            cells = ", ".join(f"[{n}]" for n in dropped[:5]) + (" ..." if len(dropped) > 5 else "")
            self._budget_notices.append(
                f"[zeroboot] checkpoints hold more memory than their budget ({budget.mib(limit)}): dropped the "
                f"oldest ({len(dropped)}: before cell {cells}); %rewind can now go back {len(self.checkpoints)} "
                f"cell(s). `%sandbox checkpoints` shows them; `%sandbox checkpoints budget SIZE` changes the "
                f"budget. (Told once per session.)\n")
        if notify:
            self._say_gaps()  # the ones this enforcement made
        if notify and over and not self._told_over:
            self._told_over = True
            self._budget_notices.append(
                f"[zeroboot] the checkpoint a crash would roll back to holds {budget.mib(floor)}, more than the "
                f"checkpoint memory budget ({budget.mib(limit)}): it is kept anyway (rollback needs it), so the "
                f"session is over its budget by {budget.mib(floor - limit)}. (Told once per session.)\n")
        return len(dropped)

    def _say_gaps(self) -> None:
        """Tell once per session that checkpoints were left as gaps (_drop_oldest), at the next cell."""
        if self.spill_gaps and not self._told_behind:
            self._told_behind = True
            gaps = [cp.number for cp in self.checkpoints if cp.dropped]  # (none left: all at the old end)
            which = f"the checkpoint before cell [{gaps[-1]}]" if gaps else "an older checkpoint"
            self._budget_notices.append(
                f"[zeroboot] cells ran faster than their checkpoints could be written to disk: {which} was "
                f"dropped instead of making the next cell wait longer, so `%rewind` cannot return to it (it can "
                f"to the others; `%sandbox checkpoints` shows the gaps). {spill.BEHIND_ENV}=wait keeps every "
                f"checkpoint, and then cells wait for the disk. (Told once per session.)\n")

    @staticmethod
    def _dropped_reason(limit: int) -> str:
        return f"older checkpoints were dropped to keep the checkpoints' memory within the budget of {budget.mib(limit)}"

    def describe_budget(self) -> dict[str, Any]:
        self._reap_spills()
        limit, held = self.budget_bytes(), self.checkpoint_memory()
        depth = len(self.checkpoints) if self.mode == "chained" else 0
        gaps = sum(1 for cp in self.checkpoints if cp.dropped)
        on_disk = sum(1 for cp in self.checkpoints if cp.snapshot is None and not cp.dropped)
        source = "set" if self.memory_budget is not None else "default: the notebook's data, 256 MiB to 1/8 of host RAM"
        why = self.budget_reason or (f"ZEROBOOT_CHECKPOINTS={self.keep} caps the count" if depth >= self.keep
                                     else "every checkpoint taken is kept")
        disk = self.spill.describe() if self.spill is not None else {}
        writing = sum(1 for cp in self.checkpoints if cp.writing is not None)
        in_memory = depth - on_disk - writing - gaps
        dropped_text = (f", {gaps} dropped while the disk writer was busy (%rewind {self._reachable_text()})"
                        if gaps else "")
        where = (f"{in_memory} in memory, {on_disk} on disk{f', {writing} being written' if writing else ''}{dropped_text} "
                 f"({budget.mib(disk.get('disk_used_bytes', 0))} of a "
                 f"disk budget of {budget.mib(disk.get('disk_budget_bytes', 0))})" if self.spill is not None
                 else f"all in memory ({self.spill_reason or 'no spill file'})")
        summary = (f"checkpoint memory budget {budget.mib(limit)} ({source}); the checkpoints hold {budget.mib(held)}; "
                   f"%rewind can go back {depth} cell(s): {why}; checkpoints: {where}")
        return {"budget_bytes": limit, "budget_source": "set" if self.memory_budget is not None else "default",
                "held_bytes": held, "over_budget": held > limit, "rewind_depth": depth,
                "dropped_for_budget": self.budget_dropped, "why": why, "summary": summary,
                "in_memory": in_memory, "on_disk": on_disk, "writing": writing, "gaps": gaps,
                "writing_bytes": self.writing_bytes(), "spilled_for_budget": self.budget_spilled,
                "spilled_while_idle": self.idle_spilled,
                "disk_budget_bytes": disk.get("disk_budget_bytes", 0), "disk_used_bytes": disk.get("disk_used_bytes", 0),
                "spill": "on" if self.spill is not None else (self.spill_reason or "off"), "where": where}

    # ---- reporting ----
    def describe_checkpoints(self) -> list[dict[str, Any]]:
        self._reap_spills()  # writes that ended show as on disk
        return [{"before_cell": cp.number, "code": cp.code.strip().splitlines()[0][:60] if cp.code.strip() else "",
                 "private_kib": cp.snapshot.private_bytes >> 10 if cp.snapshot is not None else 0,
                 "disk_kib": cp.spilled.length >> 10 if cp.spilled is not None else 0,
                 "where": cp.where(), "age_s": round(time.time() - cp.taken, 1)}
                for cp in self.checkpoints]

    def stats(self) -> dict[str, Any]:
        st = self.sandbox.guest.stats()
        t = list(self.timings)

        def p50(key: str) -> float | None:
            vals = sorted(x[key] for x in t)
            return round(vals[len(vals) // 2], 3) if vals else None

        return {
            "mode": self.mode,
            "files": {"directory": self.project_root, "notebook": self.project_dir, "mode": self.files},
            "template": {"name": self.template.name, "directory": str(self.template.directory),
                         "preload": self.template.manifest.get("preload", []),
                         "built": self.template.manifest.get("created")},
            "cells_run": self.cells_run,
            "rollbacks": self.rollbacks,
            "checkpoints": len(self.checkpoints),
            "checkpoint_kib": sum(cp.snapshot.private_bytes for cp in self.checkpoints if cp.snapshot is not None) >> 10,
            "checkpoint_budget": self.describe_budget(),
            "checkpoint_ms_p50": p50("checkpoint_ms"),
            "execute_ms_p50": p50("execute_ms"),
            "guest_memory_mib": round(st["guest_pages"] * 4096 / 2**20, 1),
            "released_mib": round(self.released_pages * 4096 / 2**20, 1),
            "guest_memory_limit_mib": round(st["guest_pages_limit"] * 4096 / 2**20, 1),
            "syscalls": st["syscalls"],
            "exits": st["exits"],
        }

    def close(self) -> None:
        self._state_changes()
        self._release_retired()
        self.clean.release()
        for cp in self.checkpoints:
            self._forget(cp)
        self.checkpoints.clear()
        self._reap_spills(wait=True)  # the writer must be done with the file and the snapshots
        if self.spill is not None:
            self.spill.close()  # an O_TMPFILE: its space is given back with its last descriptor
            self.spill = None
        if self.head is not None:
            self.head.release()
        self.sandbox.close()
