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
from typing import Any

from . import checkpoint_budget
from . import engine_wire as wire
from . import export
from .errors import ZerobootError
from .native import Engine
from .guest_view import python_view
from .session import Session
from .template import Template, TemplateConfig, default_preload

log = logging.getLogger("zeroboot_kernel.engine_server")
PR_SET_PDEATHSIG = 1
MAX_DIFF_BYTES = 8 << 20  # of relative paths in one %sandbox diff reply


def die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class EngineServer:
    def __init__(self, sock: socket.socket, session: Session) -> None:
        self.sock = sock
        self.session = session
        self.pending: list[dict[str, Any]] = []   # control messages read while a cell ran
        self.current: Any = None                  # id of the request being served
        self.running: Any = None                  # id of the execute request whose cell runs now

    def send(self, msg: dict[str, Any]) -> None:
        wire.send(self.sock, msg)

    def event(self, msg: dict[str, Any]) -> None:
        """An event of the current request, tagged with its id (the kernel drops events and
        replies of any other request)."""
        self.send({**msg, "id": self.current})

    # ---- while a cell runs ----
    def poll(self) -> None:
        """Read control messages that arrived while the guest ran (never blocks)."""
        while select.select([self.sock], [], [], 0)[0]:
            msg = wire.recv(self.sock)
            if msg.get("op") == "interrupt":
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
        self.session.sandbox.interrupt()
        return True

    def ask_input(self, prompt: str, password: bool) -> str | None:
        """The frontend's answer, or None when an interrupt of this cell ended the wait."""
        self.event({"event": "input_request", "prompt": prompt, "password": password})
        while True:
            msg = self.pending.pop(0) if self.pending else wire.recv(self.sock)
            if msg.get("op") == "input_reply":
                return str(msg.get("value", ""))
            if msg.get("op") == "interrupt" and self.interrupt(msg):
                return None
            if msg.get("op") == "interrupt":
                continue
            self.pending.append(msg)  # answered after the cell
            if len(self.pending) > 1000:
                raise wire.ChannelClosed("kernel keeps sending requests while the guest waits for input")

    # ---- requests ----
    def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        op = msg.get("op")
        s = self.session
        if op == "execute":
            self.running = msg.get("id")
            try:
                return s.execute(
                    msg["code"], execution_count=int(msg["execution_count"]), silent=bool(msg.get("silent")),
                    store_history=bool(msg.get("store_history", True)), user_expressions=msg.get("user_expressions") or {},
                    on_stream=lambda name, text: self.event({"event": "stream", "name": name, "text": text}),
                    on_message=lambda mtype, content: self.event({"event": mtype, "content": content}),
                    on_input=self.ask_input if msg.get("allow_stdin") else None, poll=self.poll)
            finally:
                self.running = None
        if op == "complete":
            return s.complete(msg["code"], int(msg["cursor_pos"]))
        if op == "inspect":
            return s.inspect(msg["code"], int(msg["cursor_pos"]), int(msg.get("detail_level", 0)))
        if op == "rewind":
            return {"status": "ok", "text": s.rewind(int(msg.get("n", 1)))}
        if op == "mode":
            return {"status": "ok", "text": s.set_mode(str(msg["mode"]))}
        if op == "timeout":
            s.timeout = float(msg["seconds"]) or None
            return {"status": "ok", "text": f"cell timeout: {s.timeout or 'none'}"}
        if op == "memory":
            return {"status": "ok", "text": s.set_memory(int(msg["bytes"]))}
        if op == "files":
            return {"status": "ok", "text": s.set_files(str(msg["mode"]))}
        if op == "diff":
            everything, changes, size = s.diff(), [], 0
            for tag, rel in everything:  # bounded, so that the reply is a reasonable message
                size += len(rel) + 8
                if size > MAX_DIFF_BYTES:
                    break
                changes.append([tag, rel])
            return {"status": "ok", "changes": changes, "more": len(everything) - len(changes)}
        # %sandbox export: the engine reads, the kernel writes (this process may not write host
        # files); file data travels in chunks, so no message is larger than export.CHUNK
        if op == "export_list":
            return {"status": "ok", "entries": export.plan_to_wire(s.export_plan(str(msg["path"])))}
        if op == "export_chunk":
            parts, offset, size = msg.get("parts"), msg.get("offset"), msg.get("size")
            if (not isinstance(parts, list) or not all(isinstance(p, str) for p in parts)
                    or type(offset) is not int or type(size) is not int):
                raise ValueError("export_chunk needs parts (list of names), offset and size (integers)")
            data = s.export_chunk(str(msg["path"]), tuple(parts), offset, size)
            return {"status": "ok", "data": base64.b64encode(data).decode()}
        if op == "lockdown_check":
            return {"status": "ok", "checks": lockdown_check()}
        if op == "checkpoints":
            return {"status": "ok", "checkpoints": s.describe_checkpoints(), "budget": s.describe_budget()}
        if op == "checkpoint_budget":
            size = msg.get("size")
            if size is None:
                return {"status": "ok", "text": s.describe_budget()["summary"]}
            try:
                limit = checkpoint_budget.parse_size(str(size))
            except checkpoint_budget.BudgetSyntaxError as exc:
                return {"status": "error", "ename": "UsageError", "evalue": str(exc), "traceback": []}
            return {"status": "ok", "text": s.set_budget(limit)}
        if op == "stats":
            return {"status": "ok", "stats": s.stats()}
        if op == "restart":
            s.restart()
            return {"status": "ok"}
        if op == "interrupt":
            return None  # nothing is running
        if op == "shutdown":
            raise SystemExit(0)
        return {"status": "error", "ename": "ValueError", "evalue": f"unknown engine request {op!r}", "traceback": []}

    def serve(self) -> None:
        while True:
            try:
                msg = self.pending.pop(0) if self.pending else wire.recv(self.sock)
            except wire.BadMessage as exc:
                log.error("dropped a malformed request from the kernel: %s", exc)
                continue
            self.current = msg.get("id")
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
            if msg.get("op") == "execute":
                # the next cell's checkpoint, taken while the kernel sends this reply on
                self.session.prepare_next_cell()


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

    return {"network": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
            "spawn": attempt(spawn), "host_file_write": attempt(write_host_file)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="zeroboot_kernel.engine_server")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--template", default="default")
    p.add_argument("--mode", default="chained")
    p.add_argument("--timeout", type=float, default=0)
    p.add_argument("--checkpoints", type=int, default=20)
    p.add_argument("--project", default=None, help="host directory shown in the guest (the notebook's)")
    p.add_argument("--files", default="overlay", choices=("overlay", "readonly", "readwrite"))
    p.add_argument("--hide", default="[]", help="JSON list of paths in the project the guest does not see")
    args = p.parse_args(argv)
    die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel decides what an interrupt means
    logging.basicConfig(level=logging.INFO, format="[zeroboot engine] %(message)s", stream=sys.stderr)
    sock = socket.socket(fileno=args.fd)
    try:
        engine = Engine.default()
        python_view()  # computed before the lockdown: it may run ldconfig
        engine.lockdown("setup")
        config = TemplateConfig(args.template, default_preload())
        template = Template.ensure(config, engine, progress=lambda m: wire.send(sock, {"event": "log", "text": m}))
        session = Session(template, mode=args.mode, keep=args.checkpoints, timeout=args.timeout or None,
                          project_dir=args.project, files=args.files, hidden=tuple(json.loads(args.hide)))
        if args.files != "readwrite":  # readwrite writes the notebook's folder from this process
            engine.lockdown("run")
            session.host_writes_allowed = False
    except ZerobootError as exc:
        wire.send(sock, {"event": "fatal", "text": str(exc)})
        return 1
    wire.send(sock, {"event": "ready", "language_info": template.ready.get("language_info", {}),
                     "python_version": template.ready.get("python_version"), "template": str(template.directory)})
    try:
        EngineServer(sock, session).serve()
    except (wire.ChannelClosed, SystemExit):
        pass
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
