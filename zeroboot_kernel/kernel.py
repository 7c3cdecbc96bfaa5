"""The Jupyter kernel: ipykernel's Kernel, with every cell run in a KVM sandbox by the engine.

    python -m zeroboot_kernel.kernel_launch -f {connection_file}   (the kernelspecs: engine started first)
    python -m zeroboot_kernel.kernel -f {connection_file}          (the same, engine started once set up)

ipykernel does the wire protocol (ZMQ channels, busy/idle, execute_input, stop_on_error, abort
replies); this class maps requests to the engine process (engine_server.py, reached through
EngineClient) and the engine's events to IOPub messages. The engine runs the guest; the kernel
process never runs user code, so it stays responsive whatever a cell does.

Threads: the main thread runs the shell channel's asyncio loop; a blocking engine request runs in
a worker thread (asyncio.to_thread) which publishes the engine's events live on IOPub (the IOPub
socket is thread-safe), answers input requests on the stdin channel, and returns the reply. The
control thread handles interrupt and shutdown meanwhile. The engine process is spawned by a
dedicated long-lived thread (EngineOwner), see there for why.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, ClassVar, cast

import zmq
from ipykernel._version import kernel_protocol_version
from ipykernel.jsonutil import json_clean
from ipykernel.kernelbase import Kernel
from traitlets import List

from . import __version__
from . import engine_requests as req
from . import export
from . import fanout
from . import fanout_jobs
from . import latency_trace
from . import session_save
from . import listing
from . import magics as mg
from . import outputs
from . import schema
from . import engine_owner
from .engine_client import EngineClient, EngineDied
from .engine_owner import EngineOwner
from .engine_owner import MagicFailed as _MagicFailed
from .engine_owner import checked_call as _checked_call
from .errors import ZerobootError
from .guest_memory_size import parse_size
from .kernel_config import KernelSettings
from .kernel_comms import CommRefused, CommRouter, header_of
from .kernel_history import CellHistory
from .language_info import local_language_info as _local_language_info
from .project_root import ProjectRootError, find_project_root
from .stream_batch import StreamBatcher

# Engine events forwarded to IOPub as they are (their "content" is the message content).
OUTPUT_EVENTS = ("display_data", "update_display_data", "execute_result", "error", "clear_output")
# Give the last reply and idle status time to leave before the kernel stops itself.
STOP_DELAY = 0.5
EXIT_ENGINE_FAILED = 1


class _InputAbandoned(Exception):
    """The engine stopped waiting for the frontend's answer (interrupt) or the kernel is stopping."""


class ZerobootKernel(Kernel):
    implementation = "zeroboot"
    implementation_version = __version__
    language = "python"

    help_links = List([
        {"text": "Python Reference", "url": "https://docs.python.org/3/"},
        {"text": "IPython Reference", "url": "https://ipython.readthedocs.io/en/stable/"},
        {"text": "NumPy Reference", "url": "https://numpy.org/doc/stable/reference/"},
        {"text": "pandas Reference", "url": "https://pandas.pydata.org/pandas-docs/stable/"},
        {"text": "Matplotlib Reference", "url": "https://matplotlib.org/stable/contents.html"},
    ]).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = KernelSettings.from_env()
        self.mode = self.settings.mode
        self.cell_timeout = self.settings.cell_timeout
        self.outputs = self.settings.outputs
        # The notebook's folder: Jupyter starts a kernel there. The kernel's own writes (export)
        # land only inside it, and it is computed here, never taken from an engine reply.
        self.notebook_dir = os.path.realpath(os.getcwd())
        # opened once: exports walk down from this fd, whatever happens to the folder's path later
        self._notebook_fd = os.open(self.notebook_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._home_note = home_folder_note(self.notebook_dir, self.settings.hidden)  # said with the first output
        if self._home_note:
            self.log.warning("%s", self._home_note.strip())
        self.history = CellHistory()
        # One engine request at a time: EngineClient is not concurrent, and the control channel
        # accepts shell requests too. Interrupts bypass it (EngineClient.interrupt is thread-safe).
        self._engine_lock = threading.Lock()
        self._executing = threading.Event()   # a cell is running in the guest
        self._fanout_jobs: fanout_jobs.FanoutJobs | None = None  # a %%fanout --jobs running now
        # An interrupt while a cell is accepted but has not reached the engine yet (it waits for
        # the engine to start, or runs its magics first) is held and sent once it has.
        self._cell_lock = threading.Lock()
        self._cell_active = False
        self._held_interrupt = False
        self._stopping = False                # shutdown or self-stop under way
        self._stop_scheduled = False
        self.fatal: str | None = None         # why the kernel stopped itself
        self._round_trips: deque[float] = deque(maxlen=200)
        self._trace: dict[str, int] | None = None  # the last cell's latency stamps (ZEROBOOT_TRACE=1)
        # comms (widgets): the frontend's comm messages go to the guest (kernel_comms.py)
        self.comms = CommRouter(self._publish_comm, blocked=lambda: self.outputs == "safe",
                                notify=lambda parent, text: self._publish(parent, "stream",
                                                                          {"name": "stderr", "text": text}))
        for msg_type in ("comm_open", "comm_msg", "comm_close"):
            self.shell_handlers[msg_type] = self.comm_request
        # started by kernel_launch.py before ipykernel was imported, else now
        self._owner = engine_owner.take_early(self.settings, self.notebook_dir) or \
            EngineOwner(self.settings, self.notebook_dir)
        self._owner.adopt(self.log, self._on_engine_exit)
        self._owner.future.add_done_callback(self._take_idle_output)
        self._owner.start_once()

    # ---- kernel_info ----------------------------------------------------------------------

    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]
        info = _local_language_info()
        client = self._client_if_ready()
        if client is not None:
            info.update(client.info.get("language_info") or {})
        return info

    @property  # ipykernel's Kernel declares banner as a plain attribute
    def banner(self) -> str:  # type: ignore[override]
        return (f"Python {self.language_info['version']} in a zeroboot KVM sandbox: every cell runs in a "
                f"copy-on-write fork ({self.mode} mode, template {self.settings.template!r}).\n"
                f"%rewind undoes cells; %sandbox help lists the kernel's magics.")

    @property
    def kernel_info(self) -> dict[str, Any]:
        # Not super().kernel_info: it advertises "debugger" when debugpy is importable and
        # "kernel subshells" whenever ipykernel runs a shell-channel thread. Neither works here:
        # nothing can attach a debugger to the guest, and one sandbox runs one cell at a time.
        return {
            "protocol_version": kernel_protocol_version,
            "implementation": self.implementation,
            "implementation_version": self.implementation_version,
            "language_info": self.language_info,
            "banner": self.banner,
            "help_links": list(self.help_links),
            "supported_features": [],
        }

    # ---- the engine -----------------------------------------------------------------------

    async def _client(self) -> EngineClient:
        """The engine client, once the engine is ready (raises what made its start fail)."""
        return await asyncio.wrap_future(self._owner.future)

    def _client_if_ready(self) -> EngineClient | None:
        f = self._owner.future
        if f.done() and f.exception() is None:
            return f.result()
        return None

    def _on_engine_exit(self, reason: str) -> None:
        """From the owner thread: the engine went away while the kernel was not shutting down."""
        if self._stopping:
            return
        with self._engine_lock:  # a request in flight reports it first (its reply goes out)
            pass
        self._schedule_stop(reason)

    def _schedule_stop(self, reason: str, failure: bool = True) -> None:
        """The sandbox is gone for good (failure), or the notebook called exit(): stop the kernel so
        that clients see a dead kernel, not a hung one. Thread-safe; the delay lets the current
        reply and idle status go out first."""
        if self.fatal is None:
            self.fatal = reason
            (self.log.error if failure else self.log.info)("zeroboot: %s; stopping the kernel", reason)
        if self._stop_scheduled or self._stopping:
            return
        loop = getattr(self, "io_loop", None)
        if loop is None:  # the kernel has not started its loop yet: the next request stops it
            return
        self._stop_scheduled = True
        loop.add_callback(lambda: loop.call_later(STOP_DELAY, self._stop_loops))

    def _stop_loops(self) -> None:
        # As Kernel.shutdown_request does, minus the reply.
        self._stopping = True
        if self.control_stream:
            control_loop = self.control_stream.io_loop
            control_loop.add_callback(control_loop.stop)
        self.io_loop.add_callback(self.io_loop.stop)
        if self.shell_stream and self.shell_stream.io_loop != self.io_loop:
            shell_loop = self.shell_stream.io_loop
            shell_loop.add_callback(shell_loop.stop)

    def close_engine(self, timeout: float = 0.5) -> None:
        self._stopping = True
        self._owner.closing.set()
        client = self._client_if_ready()
        if client is not None:
            client.close(timeout)

    # ---- IOPub ----------------------------------------------------------------------------

    def _take_idle_output(self, future: concurrent.futures.Future[EngineClient]) -> None:
        if not future.cancelled() and future.exception() is None:
            future.result().on_idle_stream = self._publish_idle_output
            future.result().on_idle_comm = self._publish_idle_comm

    def _publish_idle_output(self, name: str, text: str) -> None:
        """What a guest thread printed between cells, as it comes (the engine client's reader
        thread): sent as ipykernel sends a background thread's output, with the parent header of
        the latest shell request (ipykernel's OutStream falls back to it in a thread that did not
        set its own: in practice the cell that ran last)."""
        self._publish(self.get_parent("shell"), "stream", {"name": name, "text": text})

    def _publish_idle_comm(self, ev: dict[str, Any]) -> None:
        """A comm message a guest thread or task sent between cells (a widget updated in the
        background), as it comes: published as ipykernel publishes it, with the parent header of
        the latest shell request."""
        self.comms.guest_message(self.get_parent("shell"), ev)

    def _publish(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
        if self.session is not None:
            self.session.send(self.iopub_socket, msg_type, content, parent=parent, ident=self._topic(msg_type))

    def _publish_comm(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any], metadata: dict[str, Any],
                      topic: bytes, buffers: list[bytes]) -> None:
        """A comm message on IOPub, as ipykernel's Comm.publish_msg sends it (topic comm-<id>)."""
        if self.session is not None:
            self.session.send(self.iopub_socket, msg_type, content, parent=parent, ident=topic,
                              metadata=metadata, buffers=cast("list[bytes | memoryview[bytes]]", buffers))

    def _error_reply(self, parent: dict[str, Any], count: int, ename: str, evalue: str,
                     silent: bool = False) -> dict[str, Any]:
        """An error the kernel itself reports: shown like a Python exception, and the reply."""
        traceback = [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]
        if not silent:
            self._publish(parent, "error", {"ename": ename, "evalue": evalue, "traceback": traceback})
        return {"status": "error", "execution_count": count, "ename": ename, "evalue": evalue,
                "traceback": traceback, "user_expressions": {}, "payload": []}

    # ---- execute --------------------------------------------------------------------------

    async def do_execute(self, code: str, silent: bool, store_history: bool = True,  # type: ignore[override]
                         user_expressions: dict[str, str] | None = None, allow_stdin: bool = False,
                         *, cell_meta: dict[str, Any] | None = None, cell_id: str | None = None) -> dict[str, Any]:
        trace = {"k_enter": latency_trace.now()} if latency_trace.ENABLED else None
        count = self.execution_count  # ipykernel has already counted this request
        parent = self.get_parent("shell")
        ident = self._get_shell_context_var(self._shell_parent_ident)
        entry = self.history.record(count, code) if store_history and not silent else None
        with self._cell_lock:
            self._cell_active, self._held_interrupt = True, False
        try:
            plan = mg.split_cell(code)
            client = await self._client()
            if self._home_note and not silent:
                self._publish(parent, "stream", {"name": "stderr", "text": self._home_note})
                self._home_note = None
            if self._owner.startup_note and not silent:
                self._publish(parent, "stream", {"name": "stderr", "text": self._owner.startup_note})
                self._owner.startup_note = None
            for magic in plan.magics:
                text = await asyncio.to_thread(self._run_magic, client, magic)
                if text and not silent:
                    self._publish(parent, "stream", {"name": "stdout", "text": text})
                if isinstance(magic, mg.Rewind) or getattr(magic, "sub", None) in ("mode", "reset", "resume"):
                    await asyncio.to_thread(self._resync_comms, client, parent)
            if not plan.touches_guest and not user_expressions:
                return {"status": "ok", "execution_count": count, "user_expressions": {}, "payload": []}
            if not plan.touches_guest:
                # user_expressions are evaluated by the guest after the (here empty) cell
                store_history = False
            t0 = time.perf_counter()
            reply = await asyncio.to_thread(self._run_cell, client, plan.code, count, silent, store_history,
                                            user_expressions or {}, allow_stdin, parent, ident, entry, trace)
            self._round_trips.append((time.perf_counter() - t0) * 1e3)
            if schema.asks_exit(reply.get("payload", [])):
                # exit()/quit() in a cell: the kernel process ends after this reply, as ipykernel's
                # does (a Jupyter server then restarts it; a batch run sees a dead kernel)
                self._schedule_stop("the notebook called exit()", failure=False)
            if trace is not None:
                trace["k_back"] = latency_trace.now()
                self._trace = trace
            return reply
        except mg.MagicUsageError as exc:
            return self._error_reply(parent, count, "UsageError", str(exc), silent)
        except _MagicFailed as exc:
            return self._error_reply(parent, count, exc.ename, exc.evalue, silent)
        except EngineDied as exc:
            if self._stopping:
                return self._error_reply(parent, count, "EngineDied", f"{exc} (the kernel is shutting down)", True)
            self._schedule_stop(str(exc))
            return self._error_reply(parent, count, "EngineDied",
                                     f"{exc}. The sandbox is gone, so the kernel stops now; restart the kernel "
                                     f"to continue (the kernel log has the engine's last messages).", silent)
        except Exception as exc:  # noqa: BLE001 - an execute_reply must always go out
            if self._owner.future.done() and self._owner.future.exception() is exc:
                self._schedule_stop(f"the sandbox engine did not start: {exc}")
                return self._error_reply(parent, count, type(exc).__name__,
                                         f"the sandbox engine did not start: {exc}. The kernel stops now; "
                                         f"fix the problem and restart the kernel.", silent)
            self.log.exception("zeroboot: internal error while executing a cell")
            return self._error_reply(parent, count, type(exc).__name__,
                                     f"internal error in the zeroboot kernel: {exc} (the kernel log has the "
                                     f"details; please report it)", silent)
        finally:
            with self._cell_lock:  # an interrupt from now on has no cell: dropped
                self._cell_active, self._held_interrupt = False, False

    def _run_cell(self, client: EngineClient, code: str, count: int, silent: bool, store_history: bool,
                  user_expressions: dict[str, str], allow_stdin: bool, parent: dict[str, Any], ident: Any,
                  entry: Any, trace: dict[str, int] | None = None) -> dict[str, Any]:
        """Worker thread: run one cell in the guest, forwarding its events live. `trace`
        receives the cell's latency stamps (latency_trace.py), the engine's and the guest's too."""
        if trace is not None:
            trace["k_worker"] = latency_trace.now()
        reply_event: dict[str, Any] | None = None
        # stream text in IOPub messages as ipykernel batches it (anything else published flushes it)
        streams = StreamBatcher(lambda name, text: self._publish(parent, "stream", {"name": name, "text": text}))
        with self._engine_lock:
            self._executing.set()
            try:
                # every event was checked by EngineClient.request (schema.check_event): a
                # malformed one never gets here, and one of another request neither
                jobs = fanout.jobs_of(code) if fanout.is_fanout(code) else 1
                if jobs > 1:  # the values run in worker engines (fanout_jobs.py)
                    fj = fanout_jobs.FanoutJobs(client, self._owner.start_worker)
                    with self._cell_lock:
                        self._fanout_jobs = fj
                        if self._held_interrupt:
                            self._held_interrupt = False
                            fj.interrupted.set()
                    events = fj.run(code, count, jobs)
                else:
                    events = client.request(req.EXECUTE, code=code, execution_count=count, silent=silent,
                                            store_history=store_history, user_expressions=user_expressions,
                                            allow_stdin=allow_stdin, parent_header=header_of(parent),
                                            on_sent=lambda: self._cell_sent(client, trace))
                for ev in events:
                    kind = ev["event"]
                    if kind == "stream":
                        streams.write(ev["name"], ev["text"])
                        continue
                    if kind != "log":
                        streams.flush()
                    if kind in OUTPUT_EVENTS:
                        content = ev["content"]
                        if kind in ("display_data", "update_display_data", "execute_result"):
                            content = outputs.filter_content(content, self.outputs)
                        if kind == "execute_result":
                            content["execution_count"] = count
                            if entry is not None:
                                plain = content["data"].get("text/plain")
                                entry.output = plain if isinstance(plain, str) else None
                        self._publish(parent, kind, content)
                    elif kind == "comm":
                        self.comms.guest_message(parent, ev)
                    elif kind == "input_request":
                        try:
                            value = self._input_request(ev["prompt"], ident, parent, password=ev["password"],
                                                        abandon_fd=client.sock.fileno())
                        except _InputAbandoned:
                            continue  # the engine already answered the guest (interrupt)
                        client.input_reply(value)
                    elif kind == "reply":
                        reply_event = ev  # the last one yielded is this request's
                        if trace is not None:
                            trace["k_reply_in"] = latency_trace.now()
                            trace.update(latency_trace.checked(ev["content"].get("trace")))
                    elif kind == "log":
                        self.log.info("zeroboot: %s", ev["text"])
            finally:
                streams.flush()
                self._executing.clear()
                with self._cell_lock:
                    self._fanout_jobs = None
            if reply_event is not None and reply_event["content"].get("restored"):
                self.comms.resync(client, parent)  # a rollback or an isolated cell: widgets it made are gone
        if reply_event is None:
            raise EngineDied("the engine ended the cell without a reply")
        try:
            content = schema.execute_reply(reply_event["content"])
        except schema.SchemaError as exc:
            self.log.error("zeroboot: malformed execute reply from the engine: %s", exc)
            content = {"status": "error", "ename": "SandboxError", "traceback": [], "user_expressions": {},
                       "payload": [], "evalue": f"the cell's reply was malformed ({exc})"}
        content["execution_count"] = count
        for p in content["payload"]:  # the pager's data bundle is rendered by the frontend too
            if isinstance(p.get("data"), dict):
                p["data"] = outputs.filter_bundle(p["data"], self.outputs)
        return content

    # ---- comms (widgets) ------------------------------------------------------------------

    async def comm_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """The frontend's comm_open / comm_msg / comm_close: run in the guest like a small cell
        (Session.comm), its output and comm messages published with this message as parent. As
        in ipykernel, shell messages are handled one at a time, so one that arrives while a cell
        runs waits for the cell."""
        try:
            fields, buffers = self.comms.frontend_message(parent)
        except CommRefused as exc:
            self.log.warning("zeroboot: %s dropped: %s", parent.get("header", {}).get("msg_type"), exc)
            return
        try:
            client = await self._client()
            await asyncio.to_thread(self._run_comm, client, fields, buffers, parent)
        except EngineDied as exc:
            if not self._stopping:
                self._schedule_stop(str(exc))
        except Exception:  # noqa: BLE001 - a comm message has no reply: log, never raise into ipykernel
            self.log.exception("zeroboot: internal error while forwarding a comm message")

    def _run_comm(self, client: EngineClient, fields: dict[str, Any], buffers: list[str],
                  parent: dict[str, Any]) -> None:
        """Worker thread: one frontend comm message in the guest, its events published live."""
        streams = StreamBatcher(lambda name, text: self._publish(parent, "stream", {"name": name, "text": text}))
        reply: dict[str, Any] = {}
        with self._cell_lock:  # a runaway callback can be interrupted like a cell
            self._cell_active, self._held_interrupt = True, False
        try:
            with self._engine_lock:
                self._executing.set()
                try:
                    for ev in client.request(req.COMM, buffers=buffers, on_sent=lambda: self._send_held_interrupt(client),
                                             **fields):
                        kind = ev["event"]
                        if kind == "stream":
                            streams.write(ev["name"], ev["text"])
                            continue
                        if kind != "log":
                            streams.flush()
                        if kind == "comm":
                            self.comms.guest_message(parent, ev)
                        elif kind in OUTPUT_EVENTS:
                            content = ev["content"]
                            if kind in ("display_data", "update_display_data", "execute_result"):
                                content = outputs.filter_content(content, self.outputs)
                            self._publish(parent, kind, content)
                        elif kind == "reply":
                            reply = ev["content"]
                finally:
                    streams.flush()
                    self._executing.clear()
                if reply.get("status") == "ok" and reply.get("delivered") is False:
                    # isolated mode: the widget's sandbox was reset when its cell ended
                    self.comms.close_on_frontend(parent, [fields["comm_id"]])
                if reply.get("restored"):
                    self.comms.resync(client, parent)
        finally:
            with self._cell_lock:
                self._cell_active, self._held_interrupt = False, False

    def _resync_comms(self, client: EngineClient, parent: dict[str, Any]) -> None:
        with self._engine_lock:
            self.comms.resync(client, parent)

    def _comm_info(self, client: EngineClient, target_name: str | None) -> dict[str, Any]:
        with self._engine_lock:
            content = client.call(req.COMM_INFO, target_name=target_name)
        if content.get("status") != "ok":
            raise ZerobootError(str(content.get("evalue") or "the sandbox did not list its comms"))
        return schema.comm_registry(content)

    async def comm_info_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Answered from the guest's registry (in isolated mode: the state between cells, the template's)."""
        if not self.session:
            return
        target = parent.get("content", {}).get("target_name")
        try:
            client = await self._client()
            comms = await asyncio.to_thread(self._comm_info, client, target if isinstance(target, str) else None)
            content: dict[str, Any] = {"status": "ok", "comms": comms}
        except Exception as exc:  # noqa: BLE001 - a reply must go out
            content = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": [],
                       "comms": {}}
        self.session.send(stream, "comm_info_reply", content, parent, ident)

    # ---- kernel magics --------------------------------------------------------------------

    def _call(self, client: EngineClient, op: str, **fields: Any) -> dict[str, Any]:
        content = client.call(op, **fields)
        if content.get("status") != "ok":
            raise _MagicFailed(str(content.get("ename") or "SandboxError"),
                               str(content.get("evalue") or f"the engine could not do {op!r}"))
        return content

    def _run_magic(self, client: EngineClient, magic: mg.Magic) -> str:
        """Worker thread: run one kernel magic; returns what it prints."""
        if isinstance(magic, mg.Rewind):
            with self._engine_lock:
                return str(self._call(client, req.REWIND, n=magic.n).get("text", "")) + "\n"
        handler = self.SANDBOX_MAGICS.get(magic.sub)
        if handler is None:
            raise mg.MagicUsageError(f"unhandled %sandbox subcommand {magic!r}")
        if magic.sub == "help":  # needs no engine: answered even while another request holds it
            return handler(self, client, magic)
        with self._engine_lock:
            return handler(self, client, magic)

    # One method per %sandbox subcommand (magics.SANDBOX_PARSERS), run with the engine lock held.

    def _magic_help(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        return mg.HELP

    def _magic_mode(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        if magic.arg is None:
            return f"{self.mode} mode (switch with `%sandbox mode chained|isolated`)\n"
        text = self._call(client, req.MODE, mode=magic.arg).get("text", "")
        self.mode = magic.arg
        return f"{text}\n"

    def _magic_timeout(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        if magic.arg is not None:
            self._call(client, req.TIMEOUT, seconds=magic.seconds)
            self.cell_timeout = magic.seconds or None
        return f"cell timeout: {self._timeout_text()}\n"

    def _magic_memory(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        if magic.arg is not None:
            return str(self._call(client, req.MEMORY, bytes=parse_size(magic.arg, "%sandbox memory")).get("text", "")) + "\n"
        stats = self._call(client, req.STATS).get("stats") or {}
        return (f"sandbox memory: {stats.get('guest_memory_mib')} MiB in use of a "
                f"{stats.get('guest_memory_limit_mib')} MiB limit (change with `%sandbox memory SIZE`; "
                f"ZEROBOOT_MEMORY sets the most it can be)\n")

    def _magic_checkpoints(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        if magic.arg == "budget":  # show (dest None) or set the checkpoints' memory budget
            return str(self._call(client, req.CHECKPOINT_BUDGET, size=magic.dest).get("text", "")) + "\n"
        got = self._call(client, req.CHECKPOINTS)
        return mg.format_checkpoints(got.get("checkpoints") or [], self.mode, got.get("budget"))

    def _magic_stats(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        stats = self._call(client, req.STATS).get("stats") or {}
        trips = sorted(self._round_trips)
        return mg.format_stats(stats, {
            "timeout": self._timeout_text(),
            "round_trip_ms_p50": trips[len(trips) // 2] if trips else None,
            "engine_pid": client.proc.pid,
        })

    def _magic_network(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        """The kernel's own policy (never a guest's word), with the engine's counters."""
        text = self.settings.network.describe()
        if self.settings.network.enabled:
            stats = self._call(client, req.STATS).get("stats") or {}
            text += mg.format_network_counters(stats.get("network") or {})
        return text

    def _magic_files(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        if magic.arg is None:
            stats = self._call(client, req.STATS).get("stats") or {}
            return mg.format_files(stats.get("files") or {})
        return str(self._call(client, req.FILES, mode=magic.arg).get("text", "")) + "\n"

    def _magic_diff(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        got = self._call(client, req.DIFF)
        more = got.get("more")
        return mg.format_diff(self._checked_changes(got.get("changes")), self._project_root(),
                              more if type(more) is int and more > 0 else 0)

    def _magic_export(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        return self._export(client, magic.arg or "", magic.dest)

    def _magic_outputs(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        if magic.arg is not None:
            self.outputs = magic.arg
        return {"trusted": "outputs: trusted (HTML and JavaScript from cells reach the browser as they are)\n",
                "safe": "outputs: safe (JavaScript dropped; HTML and Markdown sanitised)\n"}[self.outputs]

    def _magic_save(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        # the path is the user's (the magic's argument), never from the engine or the guest
        path = self._save_path(magic.arg or session_save.default_name())
        t0 = time.monotonic()
        try:
            size, manifest = session_save.save_to(_checked_call(client), path, self._notebook(), session_save.save_key())
        except (OSError, ZerobootError) as exc:
            raise _MagicFailed(type(exc).__name__, f"could not save the session to {path}: {exc}") from None
        return (f"saved the session to {path} ({size / 1048576:.1f} MiB, {manifest.get('pages')} pages not the "
                f"template's, {time.monotonic() - t0:.2f} s); resume it with `%sandbox resume "
                f"{magic.arg or path.name[:-len(session_save.SUFFIX)]}` or ZEROBOOT_RESUME. Not saved: "
                + "; ".join(str(x) for x in manifest.get("not_saved", [])) + "\n")

    def _magic_resume(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        path = self._save_path(magic.arg or "")
        try:
            manifest = session_save.resume_from(_checked_call(client), path, session_save.save_key())
        except (OSError, ZerobootError) as exc:
            raise _MagicFailed(type(exc).__name__, str(exc)) from None
        self.mode = str(manifest.get("mode") or self.mode) if manifest.get("mode") in mg.MODES else self.mode
        return session_save.resumed_text(path, manifest) + "\n"

    def _magic_saves(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        return session_save.format_saves(session_save.list_saves()) + "\n"

    def _save_path(self, name: str) -> Any:
        try:
            return session_save.resolve(name)
        except session_save.SaveError as exc:
            raise _MagicFailed("SaveError", str(exc)) from None

    def _notebook(self) -> str:
        return session_save.notebook_id(self.notebook_dir)

    def _autosave(self) -> None:
        client = self._client_if_ready()
        if client is None or self.fatal:
            return
        path = session_save.resolve(session_save.autosave_name(self._notebook()))
        try:
            with self._engine_lock:
                size, _ = session_save.save_to(_checked_call(client), path, self._notebook(), session_save.save_key())
            self.log.info("zeroboot: autosaved the session to %s (%d bytes)", path, size)
        except Exception as exc:  # noqa: BLE001 - the shutdown goes on
            # An older autosave of this notebook must not be resumed as if it were this session's
            # last state: it is kept under another name (resumable by hand, listed by %sandbox saves).
            kept = session_save.set_aside(path)
            self.log.error("zeroboot: autosave to %s failed: %s%s", path, exc,
                           f"; the older autosave is kept as {kept.name}, and the next kernel starts fresh" if kept else "")

    def _magic_reset(self, client: EngineClient, magic: mg.SandboxCommand) -> str:
        self._call(client, req.RESTART)
        return ("the sandbox is back to the clean template state; every checkpoint was dropped "
                f"({self.mode} mode)\n")

    SANDBOX_MAGICS: ClassVar[dict[str, Callable[[ZerobootKernel, EngineClient, mg.SandboxCommand], str]]] = {
        "mode": _magic_mode, "checkpoints": _magic_checkpoints, "stats": _magic_stats, "timeout": _magic_timeout,
        "memory": _magic_memory, "reset": _magic_reset, "files": _magic_files, "diff": _magic_diff,
        "export": _magic_export, "outputs": _magic_outputs, "network": _magic_network, "help": _magic_help,
        "save": _magic_save, "resume": _magic_resume, "saves": _magic_saves,
    }

    @staticmethod
    def _checked_changes(changes: Any) -> list[list[str]]:
        """The engine's diff, checked: a list of [tag, relative path] pairs."""
        if not isinstance(changes, list) or not all(
                isinstance(c, list) and len(c) == 2 and c[0] in listing.TAGS.values() and isinstance(c[1], str)
                for c in changes):
            raise _MagicFailed("SandboxError", "malformed list of changes from the engine")
        return changes

    def _project_root(self) -> str:
        """The folder the sandbox shows (the engine finds it the same way, from the same
        environment); %sandbox diff paths are relative to it. A label only: no host write uses it."""
        try:
            return find_project_root(self.notebook_dir)
        except ProjectRootError:
            return self.notebook_dir

    def _export(self, client: EngineClient, path: str, dest: str | None) -> str:
        """%sandbox export: the engine lists the tree and reads it in chunks; the kernel checks
        both and writes inside the notebook's folder (export.write). Worker thread, engine lock held."""
        if dest is None:
            # an absolute guest path outside the folder (/tmp/out) lands under its own name
            inside = os.path.isabs(path) and os.path.commonpath([self.notebook_dir, os.path.normpath(path)]) == \
                self.notebook_dir
            dest = path if not os.path.isabs(path) or inside else os.path.basename(os.path.normpath(path))

        def read(parts: tuple[str, ...], offset: int, size: int) -> bytes:
            got = self._call(client, req.EXPORT_CHUNK, path=path, parts=list(parts), offset=offset, size=size)
            return export.chunk_from_wire(got, size)

        try:
            entries = export.plan_from_wire(self._call(client, req.EXPORT_LIST, path=path).get("entries"))
            report = export.write(entries, read, dest, self.notebook_dir, self._notebook_fd)
        except (OSError, ZerobootError) as exc:
            raise _MagicFailed(type(exc).__name__,
                               f"export of {listing.printable(path)} failed: {listing.printable(str(exc))}") from None
        return export.format_report(path, report)

    def _timeout_text(self) -> str:
        return f"{self.cell_timeout:g} s" if self.cell_timeout else "none"

    # ---- stdin ----------------------------------------------------------------------------

    def _input_request(self, prompt: str, ident: Any, parent: dict[str, Any], password: bool = False,
                       *, abandon_fd: int | None = None) -> str:
        """ipykernel's _input_request (same routing: the stdin channel, the request's ident and
        parent), but it runs in a worker thread, where no KeyboardInterrupt can end the wait. So it
        also watches the engine channel: the engine writes nothing while the guest waits for
        input unless an interrupt ended that wait, and then the answer is no longer wanted.
        Returns the raw value ("\\x04" included: the guest turns that into EOFError)."""
        assert self.session is not None
        while True:  # drop stale replies
            try:
                self.stdin_socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EAGAIN:
                    break
                raise
        self.session.send(self.stdin_socket, "input_request",
                          json_clean({"prompt": prompt, "password": password}), parent, ident=ident)
        watched: list[Any] = [self.stdin_socket] + ([abandon_fd] if abandon_fd is not None else [])
        while not self._stopping:
            rlist, _, xlist = zmq.select(watched, [], [self.stdin_socket], 0.1)
            if self.stdin_socket in rlist or xlist:
                rident, reply = self.session.recv(self.stdin_socket)
                if (rident, reply) == (None, None):
                    continue
                try:
                    return str(reply["content"]["value"])  # type: ignore[index]
                except (KeyError, TypeError):
                    self.log.error("zeroboot: bad input_reply: %s", reply)
                    return ""
            if rlist:
                raise _InputAbandoned()
        raise _InputAbandoned()

    # ---- interrupt / shutdown -------------------------------------------------------------

    def start(self) -> None:
        super().start()
        # interrupt_mode "signal" (the kernelspecs, as ipykernel's): the client interrupts with
        # SIGINT to the kernel's process group. The asyncio loop runs the handler as an ordinary
        # callback (never inside a lock another thread holds); the engine has its own session,
        # so the signal never reaches it.
        try:
            loop = getattr(self.io_loop, "asyncio_loop", None) or asyncio.get_event_loop()
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        except (RuntimeError, NotImplementedError, ValueError) as exc:  # not the main thread / no loop
            self.log.warning("zeroboot: cannot handle SIGINT (%s); interrupts need interrupt_request messages", exc)

    def _on_sigint(self) -> None:
        try:
            self._interrupt_cell()
        except EngineDied as exc:
            self.log.warning("zeroboot: interrupt not delivered: %s", exc)

    def _interrupt_cell(self) -> None:
        """Interrupt the cell that is running now, if any (thread-safe). The engine request in
        flight is named in the message, so an interrupt that reaches the engine after that cell
        ended is dropped there instead of hitting the next cell; one that comes before the cell
        reached the engine is held until it has (docs/PROTOCOL.md, Interrupts)."""
        with self._cell_lock:
            if not self._cell_active:
                return  # no cell: nothing to interrupt, as ipykernel between cells
            if self._fanout_jobs is not None:  # a %%fanout --jobs: EXPR, or every worker's run
                self._fanout_jobs.interrupt()
                return
            client = self._client_if_ready()
            if client is not None and self._executing.is_set() and client.interrupt():
                return
            self._held_interrupt = True

    def _cell_sent(self, client: EngineClient, trace: dict[str, int] | None) -> None:
        """Worker thread: the cell's request is on the engine channel."""
        if trace is not None:
            trace["k_sent"] = latency_trace.now()
        self._send_held_interrupt(client)

    def finish_metadata(self, parent: dict[str, Any], metadata: dict[str, Any],
                        reply_content: dict[str, Any]) -> dict[str, Any]:
        """ipykernel's hook before the execute_reply goes out: with ZEROBOOT_TRACE=1 the cell's
        latency stamps go into the reply's metadata (`zeroboot_trace`, for bench kernel)."""
        metadata = super().finish_metadata(parent, metadata, reply_content)
        if self._trace is not None:
            metadata["zeroboot_trace"] = self._trace
            self._trace = None
        return metadata

    def _send_held_interrupt(self, client: EngineClient) -> None:
        """Worker thread, right after the cell's request went to the engine."""
        with self._cell_lock:
            if self._held_interrupt:
                self._held_interrupt = False
                client.interrupt()

    async def interrupt_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Interrupt the running cell through the engine. Never signals a process group
        (ipykernel's _send_interrupt_children would SIGINT the kernel and its children): the
        engine raises KeyboardInterrupt in the guest, and if the cell is still running after its
        grace period it discards the fork and rolls the state back; the cell's reply says which."""
        if not self.session:
            return
        content: dict[str, Any] = {"status": "ok"}
        try:
            self._interrupt_cell()
        except EngineDied as exc:
            content = {"status": "error", "ename": "EngineDied", "evalue": str(exc), "traceback": []}
        self.session.send(stream, "interrupt_reply", content, parent, ident=ident)

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        # A restart is a new kernel process (the client starts it); here everything just stops.
        # ZEROBOOT_AUTOSAVE=on: a shutdown (JupyterHub's culler, closing the notebook) saves the
        # session first, for the next kernel of this notebook; a restart asks for a fresh one.
        if not restart and session_save.autosave_on():
            await asyncio.to_thread(self._autosave)
        self.close_engine(timeout=0.5)
        return {"status": "ok", "restart": restart}

    def pre_handler_hook(self) -> None:
        # ipykernel turns SIGINT into KeyboardInterrupt while a handler runs. Here SIGINT is an
        # interrupt of the guest's cell (start), never an exception in the kernel's bookkeeping
        # in the middle of a request: keep ipykernel's handler out.
        pass

    def post_handler_hook(self) -> None:
        pass

    async def create_subshell_request(self, socket: Any, ident: Any, parent: dict[str, Any]) -> None:
        if not self.session:
            return
        content = {"status": "error", "ename": "NotImplementedError", "traceback": [],
                   "evalue": "zeroboot kernels have no subshells: one sandbox runs one cell at a time"}
        self.session.send(socket, "create_subshell_reply", content, parent, ident)

    # ---- complete / inspect / is_complete / history ---------------------------------------

    def _request_if_free(self, client: EngineClient, op: str, **fields: Any) -> dict[str, Any] | None:
        """Worker thread: a side request (complete, inspect); None if the engine is busy (a
        request on the control channel while a cell runs) rather than waiting for the cell."""
        if not self._engine_lock.acquire(blocking=False):
            return None
        try:
            return client.call(op, **fields)
        finally:
            self._engine_lock.release()

    async def _side_request(self, op: str, **fields: Any) -> dict[str, Any] | None:
        try:
            client = await self._client()
            content = await asyncio.to_thread(self._request_if_free, client, op, **fields)
        except EngineDied as exc:
            self._schedule_stop(str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - an empty answer beats no answer
            self.log.warning("zeroboot: %s request failed: %s", op, exc)
            return None
        if content is None or content.get("status") != "ok":
            if content is not None:
                self.log.warning("zeroboot: %s request failed: %s", op, content.get("evalue"))
            return None
        return content

    async def do_complete(self, code: str, cursor_pos: int | None) -> dict[str, Any]:  # type: ignore[override]
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        content = await self._side_request(req.COMPLETE, code=code, cursor_pos=cursor_pos) or {}
        return {"status": "ok", "matches": list(content.get("matches") or []),
                "cursor_start": int(content.get("cursor_start", cursor_pos)),
                "cursor_end": int(content.get("cursor_end", cursor_pos)),
                "metadata": content.get("metadata") or {}}

    async def do_inspect(self, code: str, cursor_pos: int | None, detail_level: int = 0,  # type: ignore[override]
                         omit_sections: Any = ()) -> dict[str, Any]:
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        content = await self._side_request(req.INSPECT, code=code, cursor_pos=cursor_pos, detail_level=detail_level) or {}
        data = content.get("data")
        return {"status": "ok", "found": bool(content.get("found")),
                "data": outputs.filter_bundle(data, self.outputs) if isinstance(data, dict) else {},
                "metadata": content.get("metadata") if isinstance(content.get("metadata"), dict) else {}}

    async def do_is_complete(self, code: str) -> dict[str, Any]:  # type: ignore[override]
        # IPython's rules in the kernel process: no need to ask the guest, and instant.
        status, indent = mg._transformer().check_complete(code)
        reply: dict[str, Any] = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        return reply

    async def do_history(self, hist_access_type: str, output: bool, raw: bool,  # type: ignore[override]
                         session: int | None = None, start: int | None = None, stop: int | None = None,
                         n: int | None = None, pattern: str | None = None, unique: bool = False,
                         **_: Any) -> dict[str, Any]:
        return self.history.reply(hist_access_type, output=output, session=session, start=start, stop=stop,
                                  n=n, pattern=pattern, unique=unique)


def home_directories() -> set[str]:
    """The home directories of this machine's users (and $HOME), resolved."""
    homes = {os.path.expanduser("~")}
    try:
        import pwd
        homes.update(p.pw_dir for p in pwd.getpwall() if p.pw_dir not in ("", "/"))
    except (ImportError, KeyError):
        pass
    return {os.path.realpath(h) for h in homes if h}


def home_folder_note(notebook_dir: str, hidden: tuple[str, ...]) -> str | None:
    """What the kernel says when the notebook's folder is a home directory: the sandbox sees all
    of it (Jupyter started from ~), less the hidden credential paths."""
    if notebook_dir not in home_directories():
        return None
    shown = ", ".join(hidden[:8]) + (", ..." if len(hidden) > 8 else "") if hidden else "nothing"
    return (f"[zeroboot] The notebook's folder {notebook_dir} is a home directory: cells can read every file "
            f"in it except the hidden credential files and histories ({shown}; ZEROBOOT_HIDE in the "
            f"kernelspec's env changes the list). Start Jupyter from a project folder to show cells less.\n")


def _exit_watchdog(seconds: float, code: int) -> None:
    """Interpreter shutdown joins worker threads; never let a stuck one keep a dead kernel alive."""
    def bail() -> None:
        time.sleep(seconds)
        os._exit(code)
    threading.Thread(target=bail, name="zeroboot-exit-watchdog", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from ipykernel.kernelapp import IPKernelApp

    # capture_fd_output=False: the engine process shares the kernel's stderr for its log, which
    # belongs in the kernel log, not in whichever notebook cell happens to be running.
    # outstream_class=None: sys.stdout/stderr stay the process's own (the kernel log). Cells print
    # in the guest, never here; ipykernel's OutStream would only cost every request four flushes,
    # each a round trip to the IOPub thread and back (two wake-ups), for nothing to send
    # (docs/PERFORMANCE.md, where a round trip's time goes).
    app = IPKernelApp.instance(kernel_class=ZerobootKernel, capture_fd_output=False, outstream_class=None)
    app.initialize(argv)
    kernel: ZerobootKernel = app.kernel
    try:
        app.start()
    finally:
        kernel.close_engine(timeout=0.5)
    code = EXIT_ENGINE_FAILED if kernel.fatal else 0
    _exit_watchdog(3.0, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
