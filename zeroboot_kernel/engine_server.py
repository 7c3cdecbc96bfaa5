"""The engine process: owns the VM and the notebook Session; serves the kernel over a socket.

Started by EngineClient as `python -m zeroboot_kernel.engine_server --fd N ...`. Single-threaded:
while a cell runs it reads control messages between guest events (poll), and the kernel sends
SIGUSR2 (the engine's kick signal) so that a running vCPU returns promptly.
Dies with its parent (PR_SET_PDEATHSIG), so no VM outlives the kernel.
"""
from __future__ import annotations

import argparse
import base64
import ctypes
import errno
import json
import logging
import os
import select
import signal
import socket
import sys
from typing import Any, Callable, Mapping, NoReturn

from . import checkpoint_budget
from . import checkpoint_spill as spill
from . import engine_requests as req
from . import engine_wire as wire
from . import export
from . import fanout
from . import latency_trace
from . import session_save
from .schema import IDLE_COMM, IDLE_STREAM
from .errors import ZerobootError
from .native import Engine, give_back_dead_store_pages, mac_prepare, watch_fd
from .network_policy import NetworkPolicy
from .guest_view import python_view
from .session import Session
from .template import Template, TemplateConfig, default_preload

log = logging.getLogger("zeroboot_kernel.engine_server")
PR_SET_PDEATHSIG = 1
MAX_DIFF_BYTES = 8 << 20  # of relative paths in one %sandbox diff reply
# Seconds without a request after which the engine gives back the idle session's unchanged pages.
# The next cell then re-faults the pages it touches again (a small cell took 22 instead of 5.4 ms
# here: docs/ARCHITECTURE.md section 5), so not after every pause of a person working through a
# notebook (the round trip is issue 20's): after half a minute, as a class's idle sessions are.
IDLE_RELEASE_S = 30.0
SPILL_POLL_S = 0.05  # between requests, while checkpoints are being spilled: how often to look for ended writes
IDLE_RELEASE_ENV = "ZEROBOOT_IDLE_RELEASE"  # seconds instead of IDLE_RELEASE_S; 0: never (for measurements)


def idle_release_seconds(env: Mapping[str, str] = os.environ) -> float:
    """How long the engine waits idle before it gives back unchanged pages (0: never)."""
    text = env.get(IDLE_RELEASE_ENV, "").strip()
    if not text:
        return IDLE_RELEASE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        log.warning("%s=%r is not seconds between 0 and 86400: using %s", IDLE_RELEASE_ENV, text, IDLE_RELEASE_S)
        return IDLE_RELEASE_S
    return value


def die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def comm_event(content: dict[str, Any]) -> dict[str, Any]:
    """A guest comm message (a COMM_MESSAGE frame's fields) as the engine's JSON event: its
    buffers (raw bytes from the frame) travel as base64 on the JSON channel."""
    buffers = [base64.b64encode(b).decode("ascii") for b in content.get("buffers") or ()]
    return {"event": "comm", "content": {k: v for k, v in content.items() if k != "buffers"}, "buffers": buffers}


class EngineServer:
    def __init__(self, sock: socket.socket, session: Session, idle_sock: socket.socket | None = None) -> None:
        self.sock = sock
        # What guest threads print while no request runs goes to the kernel on its own channel,
        # as it comes (idle_output); without one the sandbox holds it for the next cell.
        self.idle_sock = idle_sock
        self.session = session
        self.pending: list[dict[str, Any]] = []   # control messages read while a cell ran
        self.current: Any = None                  # id of the request being served
        self.running: Any = None                  # id of the execute request whose cell runs now
        self.network_enabled = False              # the session has a network policy (main sets it)
        # every request of engine_requests.REQUESTS but the control messages, and nothing else
        self.handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
            req.EXECUTE: self._execute, req.COMPLETE: self._complete, req.INSPECT: self._inspect,
            req.REWIND: self._rewind, req.MODE: self._mode, req.TIMEOUT: self._timeout, req.MEMORY: self._memory,
            req.FILES: self._files, req.DIFF: self._diff, req.EXPORT_LIST: self._export_list,
            req.EXPORT_CHUNK: self._export_chunk, req.LOCKDOWN_CHECK: self._lockdown_check,
            req.CHECKPOINTS: self._checkpoints, req.CHECKPOINT_BUDGET: self._checkpoint_budget,
            req.STATS: self._stats, req.RESTART: self._restart, req.NEW_SESSION: self._new_session,
            req.SHUTDOWN: self._shutdown, req.COMM: self._comm, req.COMM_INFO: self._comm_info,
            req.SAVE: self._save, req.FANOUT_BASE: self._fanout_base, req.SAVE_CHUNK: self._save_chunk, req.RESUME: self._resume,
        }
        self.held_save = b""  # the save being fetched by the kernel (save_chunk)
        self.idle_release_due = False  # a request ran since the last release_idle_memory
        self.idle_spilling = False  # the idle release started spills; none ran since (finish_idle_release)
        self.idle_release_s = idle_release_seconds()

    def send(self, msg: dict[str, Any]) -> None:
        wire.send(self.sock, msg)

    def idle_output(self, name: str, text: str) -> None:
        """What a guest thread printed while no request ran (Sandbox.idle_stream): sent at once on
        the idle channel, which the kernel reads all the time (EngineClient.on_idle_stream) and
        publishes live. A kernel that reads slowly slows the guest's threads (the send blocks)."""
        assert self.idle_sock is not None
        wire.send(self.idle_sock, {"event": IDLE_STREAM, "name": name, "text": text})

    def idle_comm(self, content: dict[str, Any]) -> None:
        """A comm message a guest thread or task sent while no request ran (Sandbox.idle_comm, a
        widget updated in the background): on the idle channel as idle_output
        (EngineClient.on_idle_comm)."""
        assert self.idle_sock is not None
        wire.send(self.idle_sock, {**comm_event(content), "event": IDLE_COMM})

    def event(self, msg: dict[str, Any]) -> None:
        """An event of the current request, tagged with its id (the kernel drops events and
        replies of any other request)."""
        self.send({**msg, "id": self.current})

    # ---- while a cell runs ----
    def poll(self) -> None:
        """Read control messages that arrived while the guest ran (never blocks)."""
        while select.select([self.sock], [], [], 0)[0]:
            msg = wire.recv(self.sock)
            if msg.get("op") == req.INTERRUPT:
                self.interrupt(msg)
            else:
                self.pending.append(msg)

    def interrupt(self, msg: dict[str, Any]) -> bool:
        """An interrupt reaches the cell it names, and only while that cell runs; one that names
        another request (it ended before the interrupt arrived) is dropped, as ipykernel drops a
        SIGINT that arrives between cells."""
        if self.running is None or msg.get("target") != self.running:
            log.debug("interrupt for request %r dropped (running: %r)", msg.get("target"), self.running)
            return False
        (self.session.running_fork or self.session.sandbox).interrupt()  # a %%fanout run, else the cell
        return True

    # ---- between requests ----
    def request_waiting(self) -> bool:
        """A message from the kernel is queued or readable (never blocks)."""
        return bool(self.pending) or bool(select.select([self.sock], [], [], 0)[0])

    def between_requests(self) -> None:
        """Before waiting for the next request: let the guest's threads run until it arrives
        (Session.between_cells). The engine is single-threaded, so the socket itself stops the run:
        watched (native.watch_fd: O_ASYNC), a message's arrival sends this thread the engine's watch
        signal, which ends a KVM_RUN or a guest's sleep as an interrupt's kick does. Only for this
        run, so messages during a cell cost nothing; one that arrived before the watch began is seen
        by request_waiting, which the run asks first."""
        fd = self.sock.fileno()
        watch_fd(fd, True)
        try:
            self.session.between_cells(self.request_waiting)
        finally:
            watch_fd(fd, False)

    def ask_input(self, prompt: str, password: bool) -> str | None:
        """The frontend's answer, or None when an interrupt of this cell ended the wait."""
        self.event({"event": "input_request", "prompt": prompt, "password": password})
        while True:
            msg = self.pending.pop(0) if self.pending else wire.recv(self.sock)
            if msg.get("op") == req.INPUT_REPLY:
                return str(msg.get("value", ""))
            if msg.get("op") == req.INTERRUPT and self.interrupt(msg):
                return None
            if msg.get("op") == req.INTERRUPT:
                continue
            self.pending.append(msg)  # answered after the cell
            if len(self.pending) > 1000:
                raise wire.ChannelClosed("kernel keeps sending requests while the guest waits for input")

    # ---- requests (engine_requests.REQUESTS: the one list of them) ----
    def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        op = msg.get("op")
        if op == req.INTERRUPT:
            return None  # nothing is running
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"status": "error", "ename": "ValueError", "evalue": f"unknown engine request {op!r}",
                    "traceback": []}
        return handler(msg)

    def on_message(self, mtype: str, content: dict[str, Any]) -> None:
        """A guest message of the current request as an event (comm_event for a comm message)."""
        if mtype == "comm":
            self.event(comm_event(content))
        else:
            self.event({"event": mtype, "content": content})

    def _execute(self, msg: dict[str, Any]) -> dict[str, Any]:
        trace = {"e_recv": latency_trace.now()} if latency_trace.ENABLED else None
        s = self.session
        self.running = msg.get("id")
        parent = msg.get("parent_header")
        checkpoint = msg.get("checkpoint", True)
        if type(checkpoint) is not bool:
            raise ValueError("execute: checkpoint must be true or false")
        try:
            if fanout.is_fanout(str(msg["code"])):  # the user's %%fanout cell (fanout.py)
                reply = fanout.run(s, str(msg["code"]), execution_count=int(msg["execution_count"]),
                                   on_stream=lambda name, text: self.event({"event": "stream", "name": name, "text": text}),
                                   on_message=self.on_message, poll=self.poll, share=_share(msg.get("fanout_share")))
            else:
                reply = s.execute(
                    msg["code"], execution_count=int(msg["execution_count"]), silent=bool(msg.get("silent")),
                    store_history=bool(msg.get("store_history", True)), user_expressions=msg.get("user_expressions") or {},
                    on_stream=lambda name, text: self.event({"event": "stream", "name": name, "text": text}),
                    on_message=self.on_message, on_input=self.ask_input if msg.get("allow_stdin") else None,
                    poll=self.poll, parent_header=parent if isinstance(parent, dict) else None, trace=trace,
                    wants_checkpoint=checkpoint)
        finally:
            self.running = None
        # an isolated session resets after the reply (prepare_next_cell): its comms end with the cell
        reply["restored"] = s.take_restored() or s.mode == "isolated"
        if trace is not None:
            trace["e_reply"] = latency_trace.now()
            reply["trace"] = trace
        return reply

    def _comm(self, msg: dict[str, Any]) -> dict[str, Any]:
        buffers = msg.get("buffers") or []
        if not isinstance(buffers, list) or not all(isinstance(b, str) for b in buffers):
            raise ValueError("comm buffers must be a list of base64 strings")
        message: dict[str, Any] = {k: msg[k] for k in ("kind", "comm_id", "target_name", "target_module", "data", "metadata",
                                       "parent_header") if k in msg}
        self.running = msg.get("id")
        try:
            reply = self.session.comm(
                message, [base64.b64decode(b, validate=True) for b in buffers],
                on_stream=lambda name, text: self.event({"event": "stream", "name": name, "text": text}),
                on_message=self.on_message, poll=self.poll)
        finally:
            self.running = None
        reply["restored"] = self.session.take_restored()
        return reply

    def _comm_info(self, msg: dict[str, Any]) -> dict[str, Any]:
        target, sync = msg.get("target_name"), msg.get("sync")
        if sync is not None and (not isinstance(sync, list) or not all(isinstance(c, str) for c in sync)):
            raise ValueError("comm_info sync must be a list of comm ids")
        comms = self.session.comm_info(target if isinstance(target, str) else None, sync, self.on_message)
        return {"status": "ok", "comms": comms}

    def _complete(self, msg: dict[str, Any]) -> dict[str, Any]:
        return self.session.complete(msg["code"], int(msg["cursor_pos"]))

    def _inspect(self, msg: dict[str, Any]) -> dict[str, Any]:
        return self.session.inspect(msg["code"], int(msg["cursor_pos"]), int(msg.get("detail_level", 0)))

    def _rewind(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok", "text": self.session.rewind(int(msg.get("n", 1)))}

    def _mode(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok", "text": self.session.set_mode(str(msg["mode"]))}

    def _timeout(self, msg: dict[str, Any]) -> dict[str, Any]:
        s = self.session
        s.timeout = float(msg["seconds"]) or None
        return {"status": "ok", "text": f"cell timeout: {s.timeout or 'none'}"}

    def _memory(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok", "text": self.session.set_memory(int(msg["bytes"]))}

    def _files(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok", "text": self.session.set_files(str(msg["mode"]))}

    def _diff(self, msg: dict[str, Any]) -> dict[str, Any]:
        everything, changes, size = self.session.diff(), [], 0
        for tag, rel in everything:  # bounded, so that the reply is a reasonable message
            size += len(rel) + 8
            if size > MAX_DIFF_BYTES:
                break
            changes.append([tag, rel])
        return {"status": "ok", "changes": changes, "more": len(everything) - len(changes)}

    # %sandbox export: the engine reads, the kernel writes (this process may not write host
    # files); file data travels in chunks, so no message is larger than export.CHUNK
    def _export_list(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok", "entries": export.plan_to_wire(self.session.export_plan(str(msg["path"])))}

    def _export_chunk(self, msg: dict[str, Any]) -> dict[str, Any]:
        parts, offset, size = msg.get("parts"), msg.get("offset"), msg.get("size")
        if (not isinstance(parts, list) or not all(isinstance(p, str) for p in parts)
                or type(offset) is not int or type(size) is not int):
            raise ValueError("export_chunk needs parts (list of names), offset and size (integers)")
        data = self.session.export_chunk(str(msg["path"]), tuple(parts), offset, size)
        return {"status": "ok", "data": base64.b64encode(data).decode()}

    def _lockdown_check(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok", "checks": lockdown_check()}

    def _checkpoints(self, msg: dict[str, Any]) -> dict[str, Any]:
        s = self.session
        return {"status": "ok", "checkpoints": s.describe_checkpoints(), "budget": s.describe_budget()}

    def _checkpoint_budget(self, msg: dict[str, Any]) -> dict[str, Any]:
        s = self.session
        size = msg.get("size")
        if size is None:
            return {"status": "ok", "text": s.describe_budget()["summary"]}
        try:
            limit = checkpoint_budget.parse_size(str(size))
        except checkpoint_budget.BudgetSyntaxError as exc:
            return {"status": "error", "ename": "UsageError", "evalue": str(exc), "traceback": []}
        return {"status": "ok", "text": s.set_budget(limit)}

    def _stats(self, msg: dict[str, Any]) -> dict[str, Any]:
        stats = self.session.stats()
        if self.network_enabled:  # the engine's counters of the session's network policy
            stats["network"] = Engine.default().network_stats()
        return {"status": "ok", "stats": stats}

    def _restart(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.session.restart()
        return {"status": "ok"}

    def _new_session(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A new notebook in this engine (the batch executor): a fresh Session forked from the
        template, with the notebook's folder; the old session is closed once the new one exists,
        so a folder that cannot be shown leaves the old one in place and says why."""
        old = self.session
        project, mode, timeout, hide = msg.get("project"), msg.get("mode"), msg.get("timeout", 0), msg.get("hide", [])
        if project is not None and not isinstance(project, str):
            raise ValueError("new_session: project must be a string or null")
        if mode not in ("chained", "isolated"):
            raise ValueError("new_session: mode must be chained or isolated")
        if type(timeout) not in (int, float) or not 0 <= timeout < 1e9:
            raise ValueError("new_session: timeout must be seconds >= 0")
        if not isinstance(hide, list) or not all(isinstance(h, str) for h in hide):
            raise ValueError("new_session: hide must be a list of strings")
        policy = msg.get("checkpoints", req.EVERY_CELL)
        if policy not in req.CHECKPOINT_POLICIES:
            raise ValueError(f"new_session: checkpoints must be one of {', '.join(req.CHECKPOINT_POLICIES)}")
        new = Session(old.template, mode=mode, keep=old.keep, timeout=float(timeout) or None, project_dir=project,
                      files=old.files, hidden=tuple(hide), checkpoint_policy=policy)
        new.host_writes_allowed = old.host_writes_allowed
        self.session = new
        old.close()
        return {"status": "ok"}

    # session saves: the engine builds the file in memory, the kernel fetches it in chunks and
    # writes it (this process creates no host files); resume opens the kernel's path read-only
    def _save(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.held_save = b""
        data, manifest = session_save.capture(self.session, _key(msg), str(msg["notebook"]))
        self.held_save = data
        return {"status": "ok", "size": len(data), "manifest": manifest}

    def _fanout_base(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.held_save = b""
        self.running = msg.get("id")  # EXPR runs: an interrupt reaches it
        try:
            data, count = fanout.base(self.session, str(msg["code"]), _key(msg))
        except fanout.Failed as exc:
            return {"status": "error", "ename": exc.ename, "evalue": exc.evalue, "traceback": []}
        finally:
            self.running = None
        self.held_save = data
        return {"status": "ok", "count": count, "size": len(data), "timeout": self.session.timeout,
                "memory_limit": self.session.sandbox.memory_limit or None}

    def _save_chunk(self, msg: dict[str, Any]) -> dict[str, Any]:
        offset, size = msg.get("offset"), msg.get("size")
        if type(offset) is not int or type(size) is not int or offset < 0 or not 0 < size <= export.CHUNK:
            raise ValueError(f"save_chunk needs an offset >= 0 and a size of 1 to {export.CHUNK} bytes")
        data = self.held_save[offset:offset + size]
        if offset + size >= len(self.held_save):
            self.held_save = b""
        return {"status": "ok", "data": base64.b64encode(data).decode()}

    def _resume(self, msg: dict[str, Any]) -> dict[str, Any]:
        manifest = session_save.resume(self.session, str(msg["path"]), _key(msg))
        return {"status": "ok", "manifest": manifest}

    def _shutdown(self, msg: dict[str, Any]) -> NoReturn:
        raise SystemExit(0)

    def release_idle_memory(self) -> None:
        """No request for IDLE_RELEASE_S: give back what the idle session does not need (the
        sandbox's pages that hold the template's bytes again, and this process's freed heap), and
        start writing its %rewind checkpoints to disk (Session.spill_idle_checkpoints)."""
        self.idle_release_due = False
        pages = self.session.release_idle_memory()
        trimmed = _malloc_trim()
        self.idle_spilling = self.session.spills_writing()
        log.debug("idle: gave back %d unchanged guest pages; malloc_trim: %s", pages, trimmed)

    def finish_idle_release(self) -> None:
        """The idle release's spills are written (their snapshots released): give their store pages
        back now rather than in a later batch, and the heap their jobs used. Only after an idle
        release: between the cells of a Run All the dead pages are what the next checkpoint
        writes into (zb_snapshot_keep_spare)."""
        self.idle_spilling = False
        give_back_dead_store_pages()
        _malloc_trim()

    def serve(self) -> None:
        while True:
            if self.idle_sock is not None:  # (the session changes with new_session)
                self.session.sandbox.idle_stream = self.idle_output
                self.session.sandbox.idle_comm = self.idle_comm
            try:
                if not self.pending and self.session.runs_between_cells():
                    self.between_requests()
                elif not self.pending and self.session.spills_writing():
                    # a spilled checkpoint's memory goes once its write has ended: take that between
                    # requests too, or an idle session would hold it until its next request
                    if not select.select([self.sock], [], [], SPILL_POLL_S)[0]:
                        self.session.reap_spills()
                        if self.idle_spilling and not self.session.spills_writing():
                            self.finish_idle_release()
                        continue
                elif self.idle_release_due and self.idle_release_s and not self.pending \
                        and not select.select([self.sock], [], [], self.idle_release_s)[0]:
                    self.release_idle_memory()
                    continue  # it may have started spills: their memory goes once they are written (above)
            except (SystemExit, wire.ChannelClosed):
                raise
            except Exception:  # noqa: BLE001 - as a request's: the next request is still served
                log.exception("running the guest's threads (or giving back idle memory) between requests failed")
            try:
                msg = self.pending.pop(0) if self.pending else wire.recv(self.sock)
            except wire.BadMessage as exc:
                log.error("dropped a malformed request from the kernel: %s", exc)
                continue
            self.current = msg.get("id")
            self.idle_release_due = True
            self.idle_spilling = False
            try:
                reply = self.handle(msg)
            except (SystemExit, wire.ChannelClosed):
                raise
            except ZerobootError as exc:
                reply = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
            except Exception as exc:  # noqa: BLE001 - one request fails, never the engine (and the session)
                log.exception("request %r failed", msg.get("op"))
                reply = {"status": "error", "ename": type(exc).__name__, "traceback": [],
                         "evalue": f"the sandbox engine could not do {str(msg.get('op'))[:40]!r}: {str(exc)[:500]}"}
            if reply is not None:
                self.send({"event": "reply", "id": msg.get("id"), "content": reply})
            if msg.get("op") in (req.EXECUTE, req.COMM, req.COMM_INFO):
                # the next cell's checkpoint, taken while the kernel sends this reply on
                self.session.prepare_next_cell()


def _malloc_trim() -> bool:
    """glibc's malloc_trim(0): return the heap's free pages (a cell's big messages, a PNG's base64)
    to the host. False where there is no such function (another C library)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))


def _share(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 2 or not all(type(v) is int for v in value)
            or not 0 <= value[0] <= value[1] <= fanout.MAX_VALUES):
        raise ValueError(f"fanout_share must be [first, stop] with 0 <= first <= stop <= {fanout.MAX_VALUES}")
    return value[0], value[1]


def _key(msg: dict[str, Any]) -> bytes:
    try:
        key = bytes.fromhex(str(msg["key"]))
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError("a save request needs the 32-byte save key in hex")
    return key


def lockdown_check() -> dict[str, str]:
    """Try what the seccomp filter must refuse; report what happened (for tests and %sandbox stats)."""
    def attempt(fn: Any) -> str:
        try:
            fn()
            return "allowed"
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))

    def spawn() -> None:
        pid = os.posix_spawn("/bin/true", ["true"], {})
        os.waitpid(pid, 0)

    def write_host_file() -> None:
        os.close(os.open("/dev/null", os.O_WRONLY))

    def serve() -> None:  # a server socket: never allowed, with or without a network policy
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen()

    return {"network": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
            "server": attempt(serve),
            "netlink": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()),
            "spawn": attempt(spawn), "host_file_write": attempt(write_host_file)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="zeroboot_kernel.engine_server")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--idle-fd", type=int, default=None, help="channel for output threads print between cells")
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--template", default="default")
    p.add_argument("--mode", default="chained")
    p.add_argument("--timeout", type=float, default=0)
    p.add_argument("--checkpoints", type=int, default=20)
    p.add_argument("--project", default=None, help="host directory shown in the guest (the notebook's)")
    p.add_argument("--files", default="overlay", choices=("overlay", "readonly", "readwrite"))
    p.add_argument("--hide", default="[]", help="JSON list of paths in the project the guest does not see")
    p.add_argument("--network", default=None, help="the kernel's network policy (network_policy.py, JSON)")
    p.add_argument("--argv", default="[]", help="JSON list: the kernel's arguments, sys.argv[1:] in the guest")
    args = p.parse_args(argv)
    die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel decides what an interrupt means
    logging.basicConfig(level=logging.INFO, format="[zeroboot engine] %(message)s", stream=sys.stderr)
    sock = socket.socket(fileno=args.fd)
    idle_sock = socket.socket(fileno=args.idle_fd) if args.idle_fd is not None else None  # (before the lockdown)
    try:
        engine = Engine.default()
        network = NetworkPolicy.from_wire(args.network) if args.network else None
        engine.set_network(network)  # before the lockdown: its filters allow sockets only with a policy
        python_view()  # computed before the lockdown: it may run ldconfig
        spill.WRITER.start()  # its thread, before the lockdown forbids new ones (and then filters it too)
        mac_prepare()  # the spill file's MAC: OpenSSL reads its configuration on first use
        engine.lockdown("setup")
        config = TemplateConfig(args.template, default_preload())
        template = Template.ensure(config, engine, progress=lambda m: wire.send(sock, {"event": "log", "text": m}))
        session = Session(template, mode=args.mode, keep=args.checkpoints, timeout=args.timeout or None,
                          project_dir=args.project, files=args.files, hidden=tuple(json.loads(args.hide)),
                          argv=tuple(json.loads(args.argv)))
        if args.files != "readwrite":  # readwrite writes the notebook's folder from this process
            engine.lockdown("run")
            session.host_writes_allowed = False
    except ZerobootError as exc:
        wire.send(sock, {"event": "fatal", "text": str(exc)})
        return 1
    wire.send(sock, {"event": "ready", "language_info": template.ready.get("language_info", {}),
                     "python_version": template.ready.get("python_version"), "template": str(template.directory)})
    server = EngineServer(sock, session, idle_sock)
    session.warm_up()  # while the kernel finishes starting; its first request waits in the socket
    try:
        server.network_enabled = bool(network and network.enabled)
        server.serve()
    except (wire.ChannelClosed, SystemExit):
        pass
    finally:
        server.session.close()  # the current one: new_session replaces (and closes) the first
    return 0


if __name__ == "__main__":
    sys.exit(main())
