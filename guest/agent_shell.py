"""The IPython shell of the guest agent: a plain InteractiveShell set up the way ipykernel's
ZMQInteractiveShell is, except that every output becomes a frame on the cell channel instead of
a ZMQ message (display data, execute results, errors, pager payloads, clear_output).
"""
from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any
# User code may replace builtins (`builtins.len = ...`); the agent's own code must not follow,
# so the builtins it uses are bound as this module's globals.
from builtins import bool, bytes, dict, getattr, int, isinstance, len, list, max, min, range, str, tuple  # noqa: A004

from IPython.core import page
from IPython.core.autocall import ZMQExitAutocall
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell, InteractiveShellABC
from traitlets import CBool, Instance, Type, default
from traitlets.config import Config

import agent_io as aio


_AGENT_DIR = os.path.dirname(os.path.abspath(__file__))
# co_filename of the agent's modules (filled by make_shell, once they are all imported): a set of
# exact names, because a relative script path would resolve differently after a user's chdir.
_agent_files: frozenset[str] = frozenset()


def _find_agent_files() -> frozenset[str]:
    files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    return frozenset(f for f in files if isinstance(f, str) and os.path.basename(f).startswith("agent")
                     and os.path.dirname(os.path.abspath(f)) == _AGENT_DIR)


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


SANDBOX_NOTE = ("zeroboot: cells run as one thread in a VM sandbox; starting threads or processes "
                "(threading, concurrent.futures, subprocess, multiprocessing) is not supported here.")
# Functions of the standard library that start a process; an EAGAIN raised below them is the
# sandbox refusing clone().
_PROCESS_STARTERS = frozenset({"_execute_child", "_fork_exec", "_launch", "_posix_spawn", "fork_exec"})


def _starts_a_process(tb: TracebackType | None) -> bool:
    """Raised below a process starter, or inside multiprocessing (whose locks need /dev/shm)."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in _PROCESS_STARTERS or f"{os.sep}multiprocessing{os.sep}" in code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _explain_sandbox_refusal(value: BaseException | None) -> None:
    """Add a note saying why, to the error of a thread or process the sandbox refused to start:
    the messages Python gives ("can't start new thread", "Resource temporarily unavailable")
    do not say that it will never work here."""
    if value is None or not hasattr(value, "add_note") or SANDBOX_NOTE in getattr(value, "__notes__", ()):
        return
    thread = isinstance(value, RuntimeError) and str(value) == "can't start new thread"
    process = isinstance(value, OSError) and _starts_a_process(value.__traceback__)
    if thread or process:
        value.add_note(SANDBOX_NOTE)


class FrameDisplayPublisher(DisplayPublisher):
    """display() / update_display() / clear_output() as DISPLAY and CLEAR_OUTPUT frames."""

    def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None,  # type: ignore[override]
                source: object = None, *, transient: dict[str, Any] | None = None,
                update: bool = False, **kwargs: Any) -> None:
        self._validate_data(data, metadata)
        self.shell.channel.send(aio.DISPLAY, {
            "data": data,
            "metadata": metadata or {},
            "transient": transient or {},
            "update": bool(update),
        })

    def clear_output(self, wait: bool = False) -> None:
        self.shell.channel.send(aio.CLEAR_OUTPUT, {"wait": bool(wait)})


class FrameDisplayHook(DisplayHook):
    """The value of a cell's last expression as a RESULT frame (execute_result).

    The bundle is collected between start_displayhook and finish_displayhook, as ipykernel does;
    while it is being collected (`bundle` is not None) an error means the formatting failed.
    """

    bundle: dict[str, Any] | None = None

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
            self.shell.channel.send(aio.RESULT, {
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


class AgentShell(InteractiveShell):
    """InteractiveShell for the guest: the ZMQInteractiveShell recipe with frames for transport."""

    displayhook_class = Type(FrameDisplayHook)
    display_pub_class = Type(FrameDisplayPublisher)

    # No terminal behind this shell (as in ZMQInteractiveShell).
    readline_use = CBool(False)
    autoindent = CBool(False)

    # exit()/quit() leave the agent alive: they only tell the host through an ask_exit payload.
    exiter = Instance(ZMQExitAutocall)
    keepkernel_on_exit: bool | None = None

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

    @default("exiter")
    def _default_exiter(self) -> ZMQExitAutocall:
        return ZMQExitAutocall(self)

    def init_environment(self) -> None:
        # As ipykernel: colours for tools that check, and pagers that cannot page anyway.
        os.environ.update(TERM="xterm-color", CLICOLOR="1", FORCE_COLOR="1", CLICOLOR_FORCE="1",
                          PAGER="cat", GIT_PAGER="cat")

    def init_virtualenv(self) -> None:
        # The interpreter is already the environment's own; no venv guessing (as ipykernel).
        pass

    def init_hooks(self) -> None:
        super().init_hooks()
        self.set_hook("show_in_pager", page.as_hook(self.payloadpage_page), 99)

    def payloadpage_page(self, strg: str | dict[str, Any], start: int = 0, screen_lines: int = 0,
                         pager_cmd: str | None = None) -> None:
        """The pager (`obj?`, %page, ...): a 'page' payload in DONE, as in ipykernel."""
        data = strg if isinstance(strg, dict) else {"text/plain": strg}
        self.payload_manager.write_payload({"source": "page", "data": data, "start": max(0, start)})

    def enable_gui(self, gui: str | None = None) -> None:
        # No GUI toolkit can run in the VM; inline matplotlib needs no event loop.
        if gui not in (None, "inline"):
            raise UsageError(f"GUI event loop {gui!r} is not available in the sandbox (use inline)")
        self.active_eventloop = None

    def ask_exit(self) -> None:
        self.payload_manager.write_payload({"source": "ask_exit", "keepkernel": self.keepkernel_on_exit})

    def set_next_input(self, text: str, replace: bool = False) -> None:
        self.payload_manager.write_payload({"source": "set_next_input", "text": text, "replace": replace})

    def run_cell(self, *args: Any, **kwargs: Any) -> Any:
        self._last_traceback = None
        self._last_error = None
        self._last_traceback_during_displayhook = False
        return super().run_cell(*args, **kwargs)

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
        self.channel.send(aio.ERROR, {"ename": ename, "evalue": text, "traceback": [aio.safe_str(s) for s in stb]})
        self._last_traceback = stb
        self._last_error = (ename, text)


InteractiveShellABC.register(AgentShell)


def make_shell(channel: aio.Channel) -> AgentShell:
    global _agent_files
    _agent_files = _find_agent_files()
    config = Config()
    # An on-disk history needs a saving thread, and the VM cannot start threads.
    config.HistoryManager.hist_file = ":memory:"
    shell = AgentShell.instance(config=config)
    shell.channel = channel
    # Jedi is slow in the VM; ipykernel leaves it off by default too.
    shell.Completer.use_jedi = False
    return shell
