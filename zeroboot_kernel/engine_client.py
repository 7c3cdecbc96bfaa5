"""The kernel's handle on its engine process (engine_server.py).

One request at a time (the kernel serializes shell requests); interrupt() may be called from any
thread. If the engine process dies, every call raises EngineDied: the kernel then reports it and
exits, so that clients see a dead kernel rather than a hung one.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable, Iterator

from . import engine_requests as req
from . import engine_wire as wire
from . import schema
from .errors import ZerobootError

log = logging.getLogger(__name__)
KICK_SIGNAL = signal.SIGUSR2


class EngineDied(ZerobootError):
    """The engine process exited or crashed."""


class EngineClient:
    def __init__(self, *, template: str = "default", mode: str = "chained", timeout: float | None = None,
                 checkpoints: int = 20, project: str | None = None, files: str = "overlay",
                 hidden: tuple[str, ...] = (), network: str | None = None, on_log: Callable[[str], None] | None = None,
                 live_output: bool = False, argv: tuple[str, ...] = ()) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = parent_end
        # live_output (the kernel): what guest threads print between cells, as it comes, on the
        # idle channel, read by a thread of its own (all the time, so that the engine never waits
        # on it) and given to on_idle_stream(name, text). Without it (batch runs, papermill) the
        # engine holds that output for the next cell, whose output it then begins.
        idle_end, idle_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if live_output else (None, None)
        self.idle_sock = idle_end
        self.on_idle_stream: Callable[[str, str], None] | None = None
        # ... and their comm messages (widgets updated in the background): a checked comm event
        # (schema.comm_event) given to on_idle_comm
        self.on_idle_comm: Callable[[dict[str, Any]], None] | None = None
        self._send_lock = threading.Lock()
        self._next_id = 0
        self._in_flight: int | None = None  # the request whose reply has not arrived yet
        cmd = [sys.executable, "-m", "zeroboot_kernel.engine_server", "--fd", str(child_end.fileno()),
               "--parent", str(os.getpid()), "--template", template, "--mode", mode,
               "--timeout", str(timeout or 0), "--checkpoints", str(checkpoints), "--files", files]
        if project:
            cmd += ["--project", project, "--hide", json.dumps(list(hidden))]
        if idle_child is not None:
            cmd += ["--idle-fd", str(idle_child.fileno())]
        if network:  # the kernel's parsed policy (network_policy.NetworkPolicy.to_wire)
            cmd += ["--network", network]
        if argv:  # the kernel's own arguments, for the guest's sys.argv (agent_session.apply_argv)
            cmd += ["--argv", json.dumps(list(argv))]
        fds = [child_end.fileno()] + ([idle_child.fileno()] if idle_child is not None else [])
        self.proc = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL,
                                     start_new_session=True)  # never in the kernel's process group
        child_end.close()
        if idle_child is not None:
            idle_child.close()
        try:
            self.info = self._wait_ready(on_log or (lambda text: log.info("%s", text)))
        except BaseException:
            self.close(timeout=0.2)  # a failed start must not leave the engine process behind
            raise
        if self.idle_sock is not None:
            threading.Thread(target=self._read_idle, args=(self.idle_sock,), name="zeroboot-idle-output",
                             daemon=True).start()

    def _read_idle(self, sock: socket.socket) -> None:
        """The idle channel's reader: each message checked, then given to on_idle_stream or
        on_idle_comm (dropped without one, after a debug line); ends when the engine closes the
        channel."""
        while True:
            try:
                msg = wire.recv(sock)
            except wire.BadMessage as exc:
                log.error("zeroboot: dropped a malformed message from the engine's idle channel: %s", exc)
                continue
            except (OSError, ValueError):
                return  # the engine is gone (the request channel reports it)
            try:
                deliver = self._idle_delivery(msg)
            except schema.SchemaError as exc:
                log.error("zeroboot: dropped a malformed message from the engine's idle channel: %s", exc)
                continue
            if deliver is None:
                log.debug("zeroboot: %s sent between cells: nobody takes it", msg.get("event"))
                continue
            try:
                deliver()
            except Exception:  # noqa: BLE001 - the reader must outlive a failed publish
                log.exception("zeroboot: publishing what a thread or task sent between cells failed")

    def _idle_delivery(self, msg: dict[str, Any]) -> Callable[[], None] | None:
        """An idle channel message, checked: the call that delivers it (None: nobody takes it)."""
        kind = msg.get("event")
        if kind == schema.IDLE_STREAM:
            name, text = schema.idle_stream_event(msg)
            on_stream = self.on_idle_stream
            return None if on_stream is None else lambda: on_stream(name, text)
        if kind == schema.IDLE_COMM:
            ev = schema.comm_event(msg)
            on_comm = self.on_idle_comm
            return None if on_comm is None else lambda: on_comm(ev)
        raise schema.SchemaError(f"unknown idle channel event {str(kind)[:40]!r}")

    def _wait_ready(self, on_log: Callable[[str], None]) -> dict[str, Any]:
        while True:
            msg = self._recv()
            if msg.get("event") == "log":
                on_log(str(msg.get("text", "")))
            elif msg.get("event") == "ready":
                return msg
            elif msg.get("event") == "fatal":
                raise ZerobootError(str(msg.get("text")))

    def _recv(self) -> dict[str, Any]:
        """The next well-formed message (malformed ones are logged and dropped)."""
        while True:
            try:
                return wire.recv(self.sock)
            except wire.BadMessage as exc:
                log.error("zeroboot: dropped a malformed message from the engine: %s", exc)
            except (OSError, ValueError) as exc:
                raise EngineDied(f"the sandbox engine process died ({self._exit_status()}): {exc}") from None

    def _exit_status(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running, channel broken"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            with self._send_lock:
                wire.send(self.sock, msg)
        except OSError as exc:
            raise EngineDied(f"the sandbox engine process died ({self._exit_status()}): {exc}") from None

    def request(self, op: str, *, on_sent: Callable[[], None] | None = None,
                **fields: Any) -> Iterator[dict[str, Any]]:
        """Send one request; yield its events (stream, display_data, input_request, ...), each
        checked against its shape (schema.check_event); the last one yielded is its reply,
        {"event": "reply", "content": {...}}. Events and replies that carry another id (left
        over from an earlier request, or forged) and malformed events are logged and dropped.
        on_sent runs once the request is out (an interrupt can name it from then on).
        `op` and `fields` must be one of engine_requests.REQUESTS (ValueError otherwise)."""
        req.check_request(op, fields)
        self._next_id += 1
        rid = self._next_id
        self._in_flight = rid
        try:
            self._send({"op": op, "id": rid, **fields})
            if on_sent is not None:
                on_sent()
            while True:
                msg = self._recv()
                if msg.get("id") != rid:
                    log.warning("zeroboot: dropped a %s message of request %r while waiting for request %d",
                                str(msg.get("event"))[:40], msg.get("id"), rid)
                    continue
                if msg.get("event") == "reply":
                    self._in_flight = None  # before the caller sees it: no interrupt aims at it now
                    content = msg.get("content")
                    yield {"event": "reply", "content": dict(content) if isinstance(content, dict) else {
                        "status": "error", "ename": "EngineError", "evalue": "malformed reply from the engine"}}
                    return
                try:
                    yield schema.check_event(msg)
                except schema.SchemaError as exc:
                    log.error("zeroboot: dropped a malformed %s event from the engine: %s",
                              str(msg.get("event"))[:40], exc)
        finally:
            self._in_flight = None

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request without intermediate events; returns the reply content."""
        for msg in self.request(op, **fields):
            if msg.get("event") == "reply":
                return dict(msg["content"])
        raise EngineDied("no reply from the engine")

    def input_reply(self, value: str) -> None:
        self._send({"op": req.INPUT_REPLY, "value": value})

    def interrupt(self) -> bool:
        """Interrupt the request in flight (thread-safe): a control message naming it, then the
        kick signal so that a running or sleeping guest comes back to read it. The engine acts on
        it only while that very request runs a cell, so an interrupt that arrives late is dropped
        rather than hitting the next cell. False if no request was in flight."""
        try:
            with self._send_lock:
                target = self._in_flight
                if target is None:
                    return False
                wire.send(self.sock, {"op": req.INTERRUPT, "target": target})
        except OSError as exc:
            raise EngineDied(f"the sandbox engine process died ({self._exit_status()}): {exc}") from None
        try:
            os.kill(self.proc.pid, KICK_SIGNAL)
        except ProcessLookupError:
            pass
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 0.5) -> None:
        """Stop the engine process (and with it every VM) within about `timeout` seconds."""
        if self.proc.poll() is None:
            try:
                with self._send_lock:
                    wire.send(self.sock, {"op": req.SHUTDOWN, "id": 0})
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sock.close()
        if self.idle_sock is not None:
            self.idle_sock.close()
