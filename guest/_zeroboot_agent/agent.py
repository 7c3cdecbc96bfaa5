"""The guest agent: runs inside the VM, executes notebook cells in an IPython shell and talks to
the host in frames over the UART (docs/PROTOCOL.md).

    python guest/_zeroboot_agent --preload numpy,pandas,matplotlib

Start-up: open the UART, build the shell, import the preload modules, run a silent warm-up,
send READY (the host snapshots the template there), then serve EXECUTE / COMPLETE / INSPECT
requests one at a time inside an asyncio loop, as ipykernel does (agent_loop.py; threads that
user code starts run beside it: agent_io.py).

For tests on the host, ZEROBOOT_UART_FD=<fd> makes the agent use an inherited descriptor (e.g.
one end of a socketpair) instead of /dev/ttyS0.
"""
from __future__ import annotations

import argparse
import builtins
import gc
import getpass
import importlib
import os
import platform
import random
import sys
import traceback
from time import monotonic_ns  # bound here: user code may replace time.monotonic_ns
from typing import Any, NoReturn
# User code may replace builtins (`builtins.len = ...`); the agent's own code must not follow,
# so the builtins it uses are bound as this module's globals.
from builtins import bool, bytes, dict, getattr, int, isinstance, len, list, max, min, range, str, tuple  # noqa: A004

from . import agent_io as aio
from . import agent_mp, agent_stat_ahead
from .agent_io import log
from .frame_protocol import FrameType
from .agent_comm import CommBridge
from .agent_loop import AgentLoop
from .agent_session import insert_cwd_entry, start_session

UART_DEVICE = "/dev/ttyS0"


def open_uart() -> int:
    inherited = os.environ.get("ZEROBOOT_UART_FD")
    if inherited:
        return int(inherited)
    return os.open(UART_DEVICE, os.O_RDWR)


def _as_int(value: object, fallback: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else fallback


class Agent:
    """Serves the host's requests with one IPython shell."""

    def __init__(self, channel: aio.Channel, gate: aio.InterruptGate, shell: Any) -> None:
        self.channel = channel
        self.gate = gate
        self.shell = shell
        self.loop = AgentLoop(channel, gate)
        # IPython's autoawait runner for asyncio (`%autoawait asyncio`, the default), bound here:
        # the agent's module is imported before IPython
        self._asyncio_runner = importlib.import_module("IPython.core.async_helpers")._asyncio_runner
        self.allow_stdin = False
        # comms (widgets): the `comm` package's hooks, as ipykernel installs them (agent_comm.py)
        self.comms = CommBridge(channel, gate, shell)
        self.comms.install()

    # ---- start-up ------------------------------------------------------------------------

    def preload(self, names: list[str]) -> tuple[list[str], list[str]]:
        """Import the modules the template should hold; a failure is reported, not fatal."""
        loaded: list[str] = []
        errors: list[str] = []
        # As ipykernel's kernel app, which sets this unless the user chose a backend: matplotlib
        # then loads matplotlib_inline's backend, which hooks itself into the shell.
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        for name in names:
            try:
                # inside the shell's builtin trap, as an import in a cell is: libraries that look for
                # the builtin get_ipython() at import time (pandas: is_terminal()) must find it
                with self.shell.builtin_trap:
                    importlib.import_module(name)
            except BaseException as exc:  # noqa: BLE001 - SystemExit from a broken module too
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                log(f"preload of {name} failed: {type(exc).__name__}: {exc}")
            else:
                loaded.append(name)
        return loaded, errors

    def warm_up(self) -> None:
        """Run the paths every cell takes once, with output thrown away, so that their lazy
        imports and caches are in the template instead of being paid again in every fork."""
        cells = [
            "1 + 1",                       # displayhook, formatters
            "print('')",                   # streams
            "display(1)",                  # display publisher
            "1 / 0",                       # traceback formatting (ultratb, pygments, stack_data)
        ]
        if "numpy" in sys.modules:
            cells.append("import numpy; numpy.arange(3)")
        if "pandas" in sys.modules:
            cells.append("import pandas; pandas.DataFrame({'a': [1]})")
        if "matplotlib" in sys.modules:
            # Drawing loads the fonts; the inline backend shows and closes the figure.
            cells.append("import matplotlib.pyplot as plt; plt.figure(figsize=(1, 1)); plt.plot([0, 1]);")
        shell = self.shell
        saved_ns, saved_hidden = dict(shell.user_ns), dict(shell.user_ns_hidden)
        self.channel.quiet = True
        self.channel.quiet_stream = None
        try:
            for code in cells:
                shell.run_cell(code, store_history=False, silent=False)
            shell.complete("", "pri", 3)
            shell.object_inspect_mime("print")
        except Exception as exc:  # noqa: BLE001 - a warm-up problem only costs speed
            log(f"warm-up: {type(exc).__name__}: {exc}")
        finally:
            self.channel.flush_stream()
            # Leave no trace of the warm-up: the namespace exactly as a fresh shell has it (not
            # shell.reset(), which also drops the initial `_`), no cached outputs, no history.
            if shell.displayhook.do_full_cache:
                shell.displayhook.flush()
            shell.user_ns.clear()
            shell.user_ns.update(saved_ns)
            shell.user_ns_hidden.clear()
            shell.user_ns_hidden.update(saved_hidden)
            shell.history_manager.reset(new_session=False)
            shell.payload_manager.clear_payload()
            shell.last_execution_succeeded = True
            shell.last_execution_result = None
            # The warm-up drew a figure: IPython's %run would redraw (an empty figure) on first use.
            pyplot = sys.modules.get("matplotlib.pyplot")
            if pyplot is not None:
                pyplot.close("all")
                if hasattr(pyplot.draw_if_interactive, "called"):
                    pyplot.draw_if_interactive.called = False
            for name in ("last_type", "last_value", "last_traceback", "last_exc"):
                if hasattr(sys, name):
                    delattr(sys, name)

    def ready_payload(self, preloaded: list[str], errors: list[str]) -> dict[str, Any]:
        import IPython

        return {
            "language_info": {
                "name": "python",
                "version": platform.python_version(),
                "mimetype": "text/x-python",
                "codemirror_mode": {"name": "ipython", "version": 3},
                "pygments_lexer": "ipython3",
                "nbconvert_exporter": "python",
                "file_extension": ".py",
            },
            "implementation": sys.implementation.name,
            "python_version": platform.python_version(),
            "preloaded": preloaded,
            "preload_errors": errors,
            "ipython": IPython.__version__,
        }

    # ---- the request loop ----------------------------------------------------------------

    def serve(self) -> int:
        return self.loop.run(self._serve())

    async def _serve(self) -> int:
        while True:
            # The previous reply is out (and the host waits for the agent to wait for input before
            # it pushes a request): an interrupt from here on is for the next request.
            self.gate.wait_for_request()
            try:
                await self.loop.wait_for_request()  # the loop's tasks run meanwhile, if it has any
                frame = self.channel.read_frame()
            except aio.ProtocolError as exc:
                log(f"{exc}: cannot continue")
                return 2
            except KeyboardInterrupt:
                continue  # only possible if user code replaced the handler; nothing to interrupt
            if frame is None:
                return 0  # the host closed the channel
            ftype, request = frame
            # whatever the request, its frames are numbered from 0 (the host's channel self-check)
            self.channel.new_request()
            try:
                if ftype == FrameType.EXECUTE:
                    await self.execute(request)
                elif ftype == FrameType.COMPLETE:
                    self.complete(request)
                elif ftype == FrameType.INSPECT:
                    self.inspect(request)
                elif ftype == FrameType.SESSION:
                    self.channel.send(FrameType.SESSION_REPLY, start_session(request, self.shell))
                elif ftype == FrameType.COMM:
                    self.allow_stdin = False  # a callback has no frontend to ask (no execute_request)
                    self.comms.serve_comm(request)
                elif ftype == FrameType.COMM_INFO:
                    self.comms.serve_info(request)
                elif ftype == FrameType.RUN:
                    run_program(request)  # never returns: the VM exits with the program
                elif ftype == FrameType.INPUT_REPLY:
                    pass  # late answer to an input() that was interrupted
                else:
                    log(f"unknown frame type {ftype}; ignored")
            except KeyboardInterrupt:
                log("interrupt outside a cell; ignored")
            except Exception as exc:  # noqa: BLE001 - a bug here must not leave the host waiting
                log("request failed:\n" + traceback.format_exc())
                self._reply_failure(ftype, request, exc)

    def _reply_failure(self, ftype: int, request: dict[str, Any], exc: Exception) -> None:
        rid = request.get("id")
        if ftype == FrameType.EXECUTE:
            self.channel.send(FrameType.DONE, {
                "id": rid, "status": "error",
                "execution_count": _as_int(request.get("execution_count"), 0),
                "user_expressions": {}, "payload": [],
                "ename": type(exc).__name__, "evalue": aio.safe_str(exc),
                "traceback": traceback.format_exception(exc),
            })
        elif ftype == FrameType.COMPLETE:
            pos = _as_int(request.get("cursor_pos"), 0)
            self.channel.send(FrameType.COMPLETE_REPLY, {"id": rid, "matches": [], "cursor_start": pos,
                                                   "cursor_end": pos, "metadata": {}, "status": "ok"})
        elif ftype == FrameType.INSPECT:
            self.channel.send(FrameType.INSPECT_REPLY, {"id": rid, "status": "ok", "found": False,
                                                  "data": {}, "metadata": {}})
        elif ftype == FrameType.SESSION:
            self.channel.send(FrameType.SESSION_REPLY, {"id": rid, "status": "error",
                                                  "evalue": f"{type(exc).__name__}: {aio.safe_str(exc)}"})
        elif ftype == FrameType.COMM:
            self.channel.send(FrameType.COMM_DONE, {"id": rid, "status": "error", "ename": type(exc).__name__,
                                              "evalue": aio.safe_str(exc), "traceback": []})
        elif ftype == FrameType.COMM_INFO:
            self.channel.send(FrameType.COMM_INFO_REPLY, {"id": rid, "comms": {}})

    # ---- EXECUTE ---------------------------------------------------------------------------

    async def execute(self, request: dict[str, Any]) -> None:
        # latency stamps (zeroboot_kernel/latency_trace.py), only when the host asks for them
        stamps: list[int] | None = [monotonic_ns()] if request.get("trace") is True else None
        shell = self.shell
        code = str(request.get("code", ""))
        silent = bool(request.get("silent", False))
        store_history = bool(request.get("store_history", not silent))
        expressions = request.get("user_expressions") or {}
        count = _as_int(request.get("execution_count"), shell.execution_count)
        # the host's warm-up request (zeroboot_kernel/sandbox.py warm_up): silent, and the shell
        # left as it was, so that the first cell sees what a new ipykernel shell shows
        kept = ((shell.execution_count, shell.last_execution_result, shell.last_execution_succeeded)
                if request.get("warm_up") is True else None)
        self.allow_stdin = bool(request.get("allow_stdin", False))
        shell.execution_count = count
        shell.request_execution_count = count
        shell.payload_manager.clear_payload()  # nothing left over from a request that failed
        reseed(request.get("reseed"))
        self.comms.set_parent(request.get("parent_header"))  # the Output widget captures by it

        error: BaseException | None = None
        # Interrupts reach the cell's code only (AgentShell.run_code); in IPython's machinery
        # around it they are held until the code runs, after it they are dropped.
        self.gate.begin_request()
        try:
            if stamps is not None:
                stamps.append(monotonic_ns())
            result = await self._run_cell(code, store_history, silent)
            self.gate.end_request()
            if stamps is not None:
                stamps.append(monotonic_ns())
            error = result.error_before_exec if result.error_before_exec is not None else result.error_in_exec
            ok = result.success and not shell._last_traceback_during_displayhook
        except KeyboardInterrupt as exc:
            # Only possible if user code replaced the SIGINT handler; report it like an
            # interrupted cell.
            self.gate.end_request()
            shell.showtraceback()
            error, ok = exc, False
        finally:
            self.gate.end_request()

        reply: dict[str, Any] = {"id": request.get("id"), "execution_count": count}
        if ok:
            reply["status"] = "ok"
            if isinstance(expressions, dict):
                reply["user_expressions"] = shell.user_expressions(expressions)
            else:
                reply["user_expressions"] = {}
        else:
            ename, evalue = shell._last_error or ("UnknownError", "")
            if error is not None:
                ename, evalue = type(error).__name__, aio.safe_str(error)
            reply.update(status="error", ename=ename, evalue=evalue,
                         traceback=list(shell._last_traceback or []), user_expressions={})
        reply["payload"] = shell.payload_manager.read_payload()
        shell.payload_manager.clear_payload()
        if kept is not None:
            shell.execution_count, shell.last_execution_result, shell.last_execution_succeeded = kept
        if stamps is not None and len(stamps) == 3:  # not when run_cell raised
            stamps.append(monotonic_ns())
            reply["trace"] = stamps
        self.channel.send(FrameType.DONE, reply)

    async def _run_cell(self, code: str, store_history: bool, silent: bool) -> Any:
        """As ipykernel's do_execute: a cell with top-level await (IPython's autoawait with its
        asyncio runner) runs as a task of the running loop (AgentLoop.run_cell_task), any other
        through the shell's run_cell."""
        shell = self.shell
        if "await" not in code and "async" not in code:  # cannot await: skip the second transform
            return shell.run_cell(code, store_history=store_history, silent=silent)
        transformed, preprocessing_error = code, None
        try:
            transformed = shell.transform_cell(code)
        except Exception:  # noqa: BLE001 - run_cell_async reports it as IPython does
            preprocessing_error = sys.exc_info()
        if shell.loop_runner is not self._asyncio_runner or not shell.should_run_async(
                code, transformed_cell=transformed, preprocessing_exc_tuple=preprocessing_error):
            return shell.run_cell(code, store_history=store_history, silent=silent)
        shell.begin_cell()
        result = None
        try:
            result = await self.loop.run_cell_task(shell.run_cell_async(
                code, store_history=store_history, silent=silent, transformed_cell=transformed,
                preprocessing_exc_tuple=preprocessing_error))
        finally:  # what IPython's run_cell does around its runner
            shell.events.trigger("post_execute")
            if not silent:
                shell.events.trigger("post_run_cell", result)
        return result

    # ---- input() and getpass() -------------------------------------------------------------

    def raw_input(self, prompt: object = "") -> str:
        """builtins.input: an INPUT_REQUEST frame, then block until the INPUT_REPLY."""
        if not self.allow_stdin:
            from IPython.core.error import StdinNotImplementedError

            raise StdinNotImplementedError(
                "raw_input was called, but this frontend does not support input requests.")
        return self._input_request(str(prompt), password=False)

    def getpass(self, prompt: str = "Password: ", stream: object = None) -> str:
        """getpass.getpass: as input(), with the frontend told to hide what is typed."""
        if not self.allow_stdin:
            from IPython.core.error import StdinNotImplementedError

            raise StdinNotImplementedError(
                "getpass was called, but this frontend does not support input requests.")
        return self._input_request(str(prompt), password=True)

    def _input_request(self, prompt: str, password: bool) -> str:
        self.channel.send(FrameType.INPUT_REQUEST, {"prompt": prompt, "password": password})
        while True:
            # The wait for the reply is the one place where an interrupt may land in the agent's
            # own code: input() must be interruptible while it blocks. It loses nothing: a read
            # it interrupts has consumed nothing (EINTR), and one that had returned can only have
            # held the reply to this request (the host pushes nothing else while a cell runs,
            # and pushes each frame whole), which the interrupted cell no longer wants.
            try:
                frame = self.channel.read_frame()
            except KeyboardInterrupt:
                # As ipykernel: a short message instead of the agent's reading machinery.
                raise KeyboardInterrupt("Interrupted by user") from None
            except aio.ProtocolError as exc:
                _die(f"{exc}: cannot continue", 2)
            if frame is None:
                _die("the host closed the channel during input()", 0)
            ftype, payload = frame
            if ftype == FrameType.INPUT_REPLY:
                break
            log(f"frame type {ftype} while waiting for an input reply; ignored")
        value = payload.get("value")
        if not isinstance(value, str):
            value = ""
        if value == "\x04":  # Ctrl-D in the frontend, as in ipykernel
            raise EOFError
        return value

    # ---- COMPLETE / INSPECT ----------------------------------------------------------------

    def complete(self, request: dict[str, Any]) -> None:
        """Like ipykernel's do_complete (IPython's own completer, jedi off)."""
        from IPython.utils.tokenutil import line_at_cursor

        code = str(request.get("code", ""))
        pos = _as_int(request.get("cursor_pos"), len(code))
        reply = {"id": request.get("id"), "matches": [], "cursor_start": pos, "cursor_end": pos,
                 "metadata": {}, "status": "ok"}
        # Completion evaluates user objects (properties, __getattr__): let the host interrupt it.
        try:
            self.gate.enter_user_code()
            line, offset = line_at_cursor(code, pos)
            text, matches = self.shell.complete("", line, pos - offset)
            reply.update(matches=list(matches), cursor_start=pos - len(text))
        except KeyboardInterrupt:
            pass
        except Exception:  # noqa: BLE001 - a completion failure is an empty completion
            log("completion failed:\n" + traceback.format_exc())
        finally:
            self.gate.end_request()
        self.channel.send(FrameType.COMPLETE_REPLY, reply)

    def inspect(self, request: dict[str, Any]) -> None:
        """Like ipykernel's do_inspect."""
        from IPython.utils.tokenutil import token_at_cursor

        code = str(request.get("code", ""))
        pos = _as_int(request.get("cursor_pos"), len(code))
        detail = _as_int(request.get("detail_level"), 0)
        reply: dict[str, Any] = {"id": request.get("id"), "status": "ok", "found": False,
                                 "data": {}, "metadata": {}}
        try:
            self.gate.enter_user_code()
            name = token_at_cursor(code, pos)
            bundle = self.shell.object_inspect_mime(name, detail_level=detail, omit_sections=())
            if not self.shell.enable_html_pager:
                bundle.pop("text/html", None)
            reply.update(found=True, data=bundle)
        except (KeyError, KeyboardInterrupt):
            pass  # not found / interrupted
        except Exception:  # noqa: BLE001
            log("inspection failed:\n" + traceback.format_exc())
        finally:
            self.gate.end_request()
        self.channel.send(FrameType.INSPECT_REPLY, reply)


def reseed(seed_hex: object) -> None:
    """Fresh host entropy for a session that starts from the template, which otherwise would
    replay the template's PRNG state in every fork: `random` and numpy's global RandomState."""
    if not isinstance(seed_hex, str) or not seed_hex:
        return
    try:
        seed = bytes.fromhex(seed_hex)
    except ValueError:
        log(f"reseed: not a hex string: {seed_hex[:40]!r}; ignored")
        return
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        words = [int.from_bytes(seed[i:i + 4], "little") for i in range(0, len(seed), 4)] or [0]
        try:
            np.random.seed(words)
        except Exception as exc:  # noqa: BLE001 - a half-imported or odd numpy
            log(f"reseed numpy: {type(exc).__name__}: {exc}")


def run_program(request: dict[str, Any]) -> NoReturn:
    """RUN: behave like `python -c CODE`, `python -m MODULE` or `python FILE` with the given argv,
    in a fresh __main__, writing straight to fd 1 and 2, then exit the VM with the status python
    would have (`zeroboot-kernel run` forks the template and sends this, so imports the template
    already did cost nothing)."""
    import runpy
    import signal
    import types

    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    line = 1 if os.environ.get("PYTHONUNBUFFERED") else -1  # as python: buffered unless asked not to
    sys.stdout = open(1, "w", buffering=line, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stdin = open(os.devnull)
    sys.argv = [str(a) for a in request.get("argv") or [""]]
    builtins.input, getpass.getpass = _builtin_input, _builtin_getpass
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    status = 0
    try:
        if request.get("code") is not None:
            exec(compile(str(request["code"]), "<string>", "exec"), main.__dict__)
        elif request.get("module"):
            runpy.run_module(str(request["module"]), run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(request.get("path")), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException as exc:  # noqa: BLE001 - report like the interpreter does
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # not this function's frame
        traceback.print_exception(type(exc), exc, tb)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - nothing left to report to
            pass
    os._exit(status)


_builtin_input, _builtin_getpass = builtins.input, getpass.getpass


def _die(message: str, status: int) -> NoReturn:
    log(message)
    os._exit(status)


def _fatal_startup(message: str) -> int:
    """Start-up failed before the channel works: fd 1 is what the host shows of the console."""
    data = f"zeroboot agent: {message}\n".encode("utf-8", "replace")
    try:
        os.write(1, data)
    except OSError:
        pass
    return 1


def map_module_files() -> None:
    """Fill inspect's file -> module map for every module the template holds.

    Every traceback looks up its frames' modules (inspect.getmodule, through IPython's ultratb and
    stack_data); a file it has not seen makes it map each module not yet mapped, with an
    os.path.exists and an os.path.realpath (an lstat per path component) per module. The warm-up's
    traceback mapped what was imported before it; what start-up imported after it (multiprocessing
    for agent_mp, ...) would otherwise cost each fork's first error ~100 stats, and each one
    ~1,100 when it was ~120 modules (0.6 s in a VM, where a stat exits)."""
    import inspect

    inspect.getmodule(None, "<zeroboot template: map every module's file>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="zeroboot guest agent")
    parser.add_argument("--preload", default="", help="comma-separated modules to import at start-up")
    args = parser.parse_args(argv)
    modules = [name.strip() for name in args.preload.split(",") if name.strip()]

    try:
        fd = open_uart()
    except (OSError, ValueError) as exc:
        return _fatal_startup(f"cannot open the UART: {exc}")

    gate = aio.InterruptGate()
    channel = aio.Channel(fd, gate)
    # Until READY nothing may reach the host as frames; start-up chatter (e.g. "building the
    # font cache") goes to the raw console for diagnostics.
    channel.quiet = True
    channel.quiet_stream = lambda name, text: log(f"start-up {name}: {text}")
    aio.install_streams(channel)

    try:
        from .agent_shell import make_shell

        shell = make_shell(channel)
    except Exception:  # noqa: BLE001
        return _fatal_startup("cannot start IPython:\n" + traceback.format_exc())

    agent = Agent(channel, gate, shell)
    builtins.input = agent.raw_input
    getpass.getpass = agent.getpass  # type: ignore[assignment]

    preloaded, errors = agent.preload(modules)
    agent.warm_up()
    # The agent's package is imported: its directory leaves sys.path (as ipykernel_launcher removes
    # its own), and '' (the working directory, which a session sets to the notebook's folder) goes
    # where IPython's kernel app puts it.
    del sys.path[0]
    insert_cwd_entry()
    agent_mp.install()
    agent_stat_ahead.install()
    gate.install()
    map_module_files()
    # Everything the template holds now lives as long as the template: a full collection in a fork
    # would walk all of it (~120,000 objects with numpy, pandas and matplotlib) and write each one's
    # GC header, turning ~9,000 of the template's pages into the fork's private copies (34 MiB,
    # and a fault each). Collect what is garbage once, then move the rest to the permanent
    # generation, which collections skip (gc.freeze, as pre-fork servers do).
    gc.collect()
    gc.freeze()
    channel.quiet = False
    channel.quiet_stream = None
    channel.send(FrameType.READY, agent.ready_payload(preloaded, errors))
    status = agent.serve()
    # The channel is gone: anything printed while Python shuts down goes to the raw console.
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    return status
