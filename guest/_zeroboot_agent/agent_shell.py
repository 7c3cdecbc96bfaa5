"""The IPython shell of the guest agent: ipykernel's own ZMQInteractiveShell, except that every
output becomes a frame on the cell channel instead of a ZMQ message (display data, execute results,
errors, pager payloads, clear_output).

Being ipykernel's class (same name, a subclass, `kernel` attribute, IPKernelApp in its config,
ipykernel's cell file names) matters: libraries decide "am I in a Jupyter kernel?" from it, and
behave differently when they think they run in a terminal (pandas' display.max_columns, tqdm.auto,
rich, plotly's renderer), silently.
"""
from __future__ import annotations

import errno
import os
import sys
import tempfile
from types import TracebackType
from typing import Any
# User code may replace builtins (`builtins.len = ...`); the agent's own code must not follow,
# so the builtins it uses are bound as this module's globals.
from builtins import bool, bytes, dict, getattr, int, isinstance, len, list, max, min, range, str, tuple  # noqa: A004

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShellABC
from ipykernel import compiler as ipykernel_compiler
from ipykernel import zmqshell
from ipykernel.compiler import XCachingCompiler
from traitlets import CBool, Type
from traitlets.config import Config

from . import agent_io as aio
from . import agent_pip
from .frame_protocol import FrameType


# How long an interrupted `!cmd` may take to end after its ^C (_prepare_system).
_INTERRUPTED_COMMAND_GRACE_S = 0.5


class CellCompiler(XCachingCompiler):
    """ipykernel's compiler, with its cell file names (<tmp>/ipykernel_<pid>/<hash>.py), less the
    os.getpid() that ipykernel's get_tmp_directory makes for every cell: a syscall, which is a VM
    exit here, one of the four a `1+1` cell cost (issue 20). The pid is read once: the guest cannot
    fork, so it never changes (and every sandbox is pid 1)."""

    _pid: int | None = None

    def get_code_name(self, raw_code: str, code: Any, number: int) -> str:
        name = os.environ.get("IPYKERNEL_CELL_NAME")
        if name is not None:
            return name
        if CellCompiler._pid is None:
            CellCompiler._pid = os.getpid()
        tmp = ipykernel_compiler.convert_to_long_pathname(tempfile.gettempdir())
        digest = ipykernel_compiler.murmur2_x86(raw_code, ipykernel_compiler.get_tmp_hash_seed())
        return f"{tmp}{os.sep}ipykernel_{CellCompiler._pid}{os.sep}{digest}.py"


_AGENT_DIR = os.path.dirname(os.path.abspath(__file__))
# co_filename of the agent's modules (filled by make_shell, once they are all imported): a set of
# exact names, because a relative script path would resolve differently after a user's chdir.
_agent_files: frozenset[str] = frozenset()


def _find_agent_files() -> frozenset[str]:
    files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    return frozenset(f for f in files if isinstance(f, str) and os.path.dirname(os.path.abspath(f)) == _AGENT_DIR)


def _is_agent_code(filename: str) -> bool:
    return filename in _agent_files


def _without_agent_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without entries for the agent's modules (relinked in place)."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    kept = [t for t in entries if not _is_agent_code(t.tb_frame.f_code.co_filename)]
    if not kept or len(kept) == len(entries):
        return entries[0] if entries else None
    for here, after in zip(kept, kept[1:] + [None]):
        here.tb_next = after
    return kept[0]


SANDBOX_NOTE = ("zeroboot: the sandbox refused to start another process (EAGAIN): its limit of processes "
                "(64 by default) is reached, exited children not yet waited for included; wait for finished "
                "children (Popen.wait, Pool.close + join) or use a Pool with fewer workers.")
THREAD_LIMIT_NOTE = ("zeroboot: the sandbox's limit of threads is reached (threads that have not ended count); "
                     "join finished threads, or use a ThreadPoolExecutor with fewer workers.")
SHARED_MAPPING_NOTE = ("zeroboot: writable shared file mappings are not supported in the sandbox for the "
                       "notebook folder's files in readwrite mode (np.memmap mode 'w+'/'r+', mmap.mmap with "
                       "write access, sqlite's WAL journal), nor for a second shared mapping of a file range "
                       "that is already mapped shared and writable; files in /tmp, the home directory and a "
                       "notebook folder in overlay mode can be mapped. Otherwise use np.memmap mode 'c' "
                       "(copy-on-write) or 'r', read the file into memory, or keep sqlite's default journal mode.")
NETWORK_NOTE = ("zeroboot: the sandbox's network policy refused this connection (EACCES): cells reach only the "
                "destinations the kernel's ZEROBOOT_NETWORK setting allows (none by default). The zeroboot line "
                "printed above names the address and what to add; `%sandbox network` shows the list.")
# Functions that open a client connection (socket, http.client, urllib3, asyncio): a PermissionError
# raised below one of them is the engine's network policy (native/sys_inet.c) refusing it.
_CONNECTORS = frozenset({"create_connection", "sock_connect", "_sock_connect", "_connect_sock", "_new_conn"})
# Functions of the standard library that start a process; an EAGAIN raised below them is the
# sandbox refusing clone().
_PROCESS_STARTERS = frozenset({"_execute_child", "_fork_exec", "_launch", "_posix_spawn", "fork_exec"})


def _starts_a_process(tb: TracebackType | None) -> bool:
    """Raised below a process starter, or inside multiprocessing (which forks in its own code)."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in _PROCESS_STARTERS or f"{os.sep}multiprocessing{os.sep}" in code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _network_refusal(value: BaseException) -> bool:
    """A PermissionError raised below a connector, in value or what caused it (urllib's URLError,
    requests' ConnectionError wrap it), at most 10 levels down."""
    seen: BaseException | None = value
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, PermissionError) and seen.errno == errno.EACCES:
            tb = seen.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_name in _CONNECTORS:
                    return True
                tb = tb.tb_next
        reason = getattr(seen, "reason", None)  # urllib.error.URLError keeps the OSError there
        seen = seen.__cause__ or seen.__context__ or (reason if isinstance(reason, BaseException) else None)
    return False


def _memory_note() -> str:
    """Why a MemoryError happened in the sandbox, and how to get more (sysinfo: the guest's limit)."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        limit, free = os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
        sizes = f"{limit / 2**30:.1f} GiB, {free / 2**30:.1f} GiB of it free"
    except (OSError, ValueError):
        sizes = "limited"
    return (f"zeroboot: the sandbox's memory is the limit here ({sizes}), not the host's: raise it with "
            f"`%sandbox memory SIZE`, or beyond the sandbox's size set ZEROBOOT_MEMORY=SIZE in the kernelspec's env "
            f"and restart the kernel.")


def _is_shared_mapping_refusal(value: BaseException) -> bool:
    """ENODEV from mmap (the engine's answer to MAP_SHARED + PROT_WRITE of a host file), EBUSY (a
    second shared mapping overlapping a writable one), or sqlite's "disk I/O error" (what WAL mode
    reports when it cannot map its -shm file)."""
    if SHARED_MAPPING_NOTE in getattr(value, "__notes__", ()):
        return False
    if isinstance(value, OSError) and value.errno in (errno.ENODEV, errno.EBUSY):
        tb = value.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename.endswith("memmap.py") or "mmap" in code.co_names:
                return True
            tb = tb.tb_next
        return False
    return type(value).__name__ == "OperationalError" and str(value) == "disk I/O error" and \
        type(value).__module__ == "sqlite3"


def _explain_sandbox_refusal(value: BaseException | None) -> None:
    """Add a note saying why, to the error of a process the sandbox refused to start or a thread
    past its limit: the messages Python gives ("Resource temporarily unavailable", "can't start
    new thread") do not say that the sandbox is the reason."""
    if value is None or not hasattr(value, "add_note") or SANDBOX_NOTE in getattr(value, "__notes__", ()):
        return
    if isinstance(value, MemoryError):
        if not any(str(n).startswith("zeroboot: the sandbox's memory") for n in getattr(value, "__notes__", ())):
            value.add_note(_memory_note())
        return
    if _is_shared_mapping_refusal(value):
        value.add_note(SHARED_MAPPING_NOTE)
        return
    if NETWORK_NOTE not in getattr(value, "__notes__", ()) and _network_refusal(value):
        value.add_note(NETWORK_NOTE)
        return
    if isinstance(value, RuntimeError) and str(value) == "can't start new thread":
        if THREAD_LIMIT_NOTE not in getattr(value, "__notes__", ()):
            value.add_note(THREAD_LIMIT_NOTE)
        return
    if isinstance(value, BlockingIOError) and _starts_a_process(value.__traceback__):
        value.add_note(SANDBOX_NOTE)  # fork's EAGAIN: the process limit (native/sys_procs.c)


class FrameDisplayPublisher(DisplayPublisher):
    """display() / update_display() / clear_output() as DISPLAY and CLEAR_OUTPUT frames.

    Hooks work as in ipykernel's ZMQDisplayPublisher: each is called with the message about to
    be sent and may return it (possibly changed) or None to swallow it (output capturing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hooks: list[Any] = []

    def register_hook(self, hook: Any) -> None:
        self._hooks.append(hook)

    def unregister_hook(self, hook: Any) -> bool:
        try:
            self._hooks.remove(hook)
            return True
        except ValueError:
            return False

    def set_parent(self, parent: Any) -> None:
        pass  # messages are addressed by the host

    def _through_hooks(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any] | None:
        msg: dict[str, Any] | None = {"msg_type": msg_type, "header": {"msg_type": msg_type},
                                      "parent_header": {}, "metadata": {}, "content": content}
        for hook in list(self._hooks):
            msg = hook(msg)
            if msg is None:
                return None
        return msg.get("content", content) if isinstance(msg, dict) else content

    def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None,  # type: ignore[override]
                source: object = None, *, transient: dict[str, Any] | None = None,
                update: bool = False, **kwargs: Any) -> None:
        self._validate_data(data, metadata)
        content = {"data": data, "metadata": metadata or {}, "transient": transient or {}}
        if self._hooks:
            got = self._through_hooks("update_display_data" if update else "display_data", content)
            if got is None:
                return
            content = got
        self.shell.channel.send(FrameType.DISPLAY, {
            "data": content.get("data", {}),
            "metadata": content.get("metadata") or {},
            "transient": content.get("transient") or {},
            "update": bool(update),
        })

    def clear_output(self, wait: bool = False) -> None:
        if self._hooks and self._through_hooks("clear_output", {"wait": bool(wait)}) is None:
            return
        self.shell.channel.send(FrameType.CLEAR_OUTPUT, {"wait": bool(wait)})


class FrameDisplayHook(DisplayHook):
    """The value of a cell's last expression as a RESULT frame (execute_result).

    The bundle is collected between start_displayhook and finish_displayhook, as ipykernel does;
    while it is being collected (`bundle` is not None) an error means the formatting failed.
    """

    bundle: dict[str, Any] | None = None

    def set_parent(self, parent: Any) -> None:
        pass  # messages are addressed by the host (the shell's set_parent calls this: Output widgets)

    def start_displayhook(self) -> None:
        super().start_displayhook()
        self.bundle = {"data": {}, "metadata": {}}

    def write_output_prompt(self) -> None:
        # No "Out[n]:" text: the count travels in the frame.
        pass

    def write_format_data(self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None) -> None:
        if self.bundle is not None:
            self.bundle = {"data": format_dict, "metadata": md_dict or {}}

    def finish_displayhook(self) -> None:
        bundle, self.bundle = self.bundle, None
        self._is_active = False  # IPython 9 tracks this for its output history
        if bundle and bundle["data"]:
            shell = self.shell
            self.shell.channel.send(FrameType.RESULT, {
                # IPython 8 and 9 disagree on when execution_count is incremented; the host's
                # count for this request is the one the cell must be shown with.
                "execution_count": shell.request_execution_count,
                "data": bundle["data"],
                "metadata": bundle["metadata"],
            })


def _interrupt_at(code_obj: Any) -> Any:
    """A code object that raises KeyboardInterrupt at the first line of code_obj, in the same
    file (so the traceback shows the cell's line, as an interrupt at that moment would)."""
    try:
        line = min((ln for _, _, ln in code_obj.co_lines() if ln), default=1)
    except (AttributeError, TypeError):
        line = 1
    return compile("\n" * (line - 1) + "raise KeyboardInterrupt", getattr(code_obj, "co_filename", "<cell>"), "exec")


class SandboxKernel:
    """What `get_ipython().kernel` is in the sandbox. The kernel itself (ZMQ sockets, session)
    runs on the host; code that reaches for those parts gets an AttributeError that says so
    instead of a half-working imitation. Comms are the exception: agent_comm.CommBridge.install
    gives it `comm_manager` and `get_parent` (widgets use them)."""

    implementation = "zeroboot"
    eventloop = None  # no GUI event loop runs in the sandbox (ipykernel's exit path checks it)

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"get_ipython().kernel.{name}: the Jupyter kernel runs outside the zeroboot "
                             f"sandbox; its sockets and session are not reachable from a cell (comms are: "
                             f"use the `comm` package, comm.create_comm / comm.get_comm_manager)")

    def __repr__(self) -> str:
        return "<zeroboot sandbox kernel>"


class ZMQInteractiveShell(zmqshell.ZMQInteractiveShell):
    """ipykernel's shell (same class name, a subclass of it) with frames for transport."""

    displayhook_class = Type(FrameDisplayHook)
    display_pub_class = Type(FrameDisplayPublisher)

    # No terminal behind this shell (as in ZMQInteractiveShell).
    readline_use = CBool(False)
    autoindent = CBool(False)

    # Set by make_shell before any cell runs.
    channel: aio.Channel
    request_execution_count: int = 0
    # The ERROR frame last sent for the current request, for DONE's ename/evalue/traceback.
    _last_traceback: list[str] | None = None
    _last_error: tuple[str, str] | None = None
    _last_traceback_during_displayhook = False

    async def run_code(self, code_obj: Any, result: Any = None, *, async_: bool = False) -> bool:  # type: ignore[override]
        """The user's code, and only it, is where an interrupt raises KeyboardInterrupt
        (agent_io.InterruptGate); one that arrived while IPython prepared the cell is raised at
        the cell's first line, inside IPython's handling, so it reports it as usual."""
        gate = self.channel.gate
        previous = gate.phase  # user code when a cell runs another (get_ipython().run_cell)
        if gate.take_held():
            code_obj = _interrupt_at(code_obj)
        try:
            return await super().run_code(code_obj, result, async_=async_)
        finally:
            gate.leave_user_code(previous)

    def enable_gui(self, gui: str | None = None) -> None:
        # No GUI toolkit can run in the VM; inline matplotlib needs no event loop.
        if gui not in (None, "inline"):
            raise UsageError(f"GUI event loop {gui!r} is not available in the sandbox (use inline)")
        self.active_eventloop = None

    def run_cell(self, *args: Any, **kwargs: Any) -> Any:
        self.begin_cell()
        return super().run_cell(*args, **kwargs)

    def begin_cell(self) -> None:
        """A cell starts (run_cell, or the agent's run_cell_async of a cell that awaits): the
        errors of an earlier one are not its."""
        self._last_traceback = None
        self._last_error = None
        self._last_traceback_during_displayhook = False

    def _get_exc_info(self, exc_tuple: Any = None) -> tuple[Any, Any, Any]:
        # Every traceback IPython shows goes through here: leave out the agent's own frames
        # (input() refusing or being interrupted, a stream write raising), which tell the user
        # nothing about their code.
        etype, value, tb = super()._get_exc_info(exc_tuple)
        _explain_sandbox_refusal(value)
        return etype, value, _without_agent_frames(tb)

    def _showtraceback(self, etype: type[BaseException], evalue: BaseException, stb: list[str]) -> None:
        if getattr(self.displayhook, "bundle", None) is not None:
            # The error happened while formatting the result: the request failed (ipykernel).
            self._last_traceback_during_displayhook = True
        ename, text = aio.safe_str(getattr(etype, "__name__", etype)), aio.safe_str(evalue)
        self.channel.send(FrameType.ERROR, {"ename": ename, "evalue": text, "traceback": [aio.safe_str(s) for s in stb]})
        self._last_traceback = stb
        self._last_error = (ename, text)


InteractiveShellABC.register(ZMQInteractiveShell)
AgentShell = ZMQInteractiveShell


def _prepare_system() -> None:
    """`!cmd` is ipykernel's own (IPython's pexpect-based ProcessHandler.system, on one of the
    sandbox's ptys). Two guest adaptations: pexpect is imported now, so that the template holds it
    instead of every fork paying the import at its first `!cmd`; and an interrupted command gets
    more time to end after its ^C than IPython's 0.2 s before it is terminated (SIGHUP, then
    SIGKILL), since a guest process is slower to reach its handler (a shell's `trap ... INT` runs,
    as it does under ipykernel). Bounded well below the session's 2 s interrupt grace, after which
    the cell would be rolled back: 0.5 s here plus terminate's 0.4 s."""
    try:
        import pexpect  # noqa: F401
        from IPython.utils import _process_posix
    except ImportError as exc:  # without pexpect IPython's system reports it at the first `!cmd`
        aio.log(f"!cmd: {type(exc).__name__}: {exc}")
        return
    _process_posix.ProcessHandler.terminate_timeout = _INTERRUPTED_COMMAND_GRACE_S


def _debugger_absent_breakpoint(*args: Any, **kwargs: Any) -> None:
    """breakpoint() without a debugger client: nothing, as under ipykernel, whose debugpy makes it
    pause only while a frontend's visual debugger is attached (this kernel has none: its
    kernelspec says debugger false). `import pdb; pdb.set_trace()` and %debug stop, with ipdb."""


def _prepare_debugging() -> None:
    """As ipykernel's kernel app: pdb is IPython's interruptible debugger (pdb.set_trace stops at an
    `ipdb>` prompt read through input requests, and an interrupt ends it instead of leaving the
    cell stuck), and breakpoint() is debugpy's hook, which does nothing without a debugger client
    (a notebook with a leftover breakpoint() runs through, in a batch run too)."""
    import pdb

    from IPython.core import debugger

    if hasattr(debugger, "InterruptiblePdb"):
        debugger.Pdb = debugger.InterruptiblePdb  # type: ignore[misc]
        pdb.Pdb = debugger.Pdb  # type: ignore[assignment,misc]
        pdb.set_trace = debugger.set_trace
    sys.breakpointhook = _debugger_absent_breakpoint


def make_shell(channel: aio.Channel) -> ZMQInteractiveShell:
    global _agent_files
    _agent_files = _find_agent_files()
    config = Config()
    # No on-disk history: its saving thread would write a database into the sandbox's home after
    # every cell, and the session's checkpoints are the history that matters here.
    config.HistoryManager.hist_file = ":memory:"
    # As ipykernel's kernel app: cells are compiled under ipykernel's file names
    # (<tmp>/ipykernel_<pid>/<hash>.py), which tracebacks, warnings and linecache show.
    shell = ZMQInteractiveShell.instance(config=config, compiler_class=CellCompiler)
    shell.channel = channel
    shell.kernel = SandboxKernel(shell)
    # Jedi is slow in the VM; ipykernel leaves it off by default too.
    shell.Completer.use_jedi = False
    # %pip: IPython's, installing into the sandbox's own site-packages (agent_pip.py)
    agent_pip.enable_site()
    shell.register_magic_function(lambda line: agent_pip.pip_magic(shell, line), "line", "pip")
    _prepare_system()
    _prepare_debugging()
    # As ipykernel's kernel app (IPython's default_extensions): %store.
    try:
        shell.extension_manager.load_extension("storemagic")
    except Exception as exc:  # noqa: BLE001 - a missing extension costs only %store
        aio.log(f"storemagic: {type(exc).__name__}: {exc}")
    return shell
