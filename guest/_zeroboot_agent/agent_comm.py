"""Jupyter comms in the guest (docs/PROTOCOL.md, "Comms"): what ipywidgets, tqdm.notebook and
ipympl talk to the frontend through.

ipykernel 7 installs its comm machinery by replacing the `comm` package's two hooks,
`comm.create_comm` and `comm.get_comm_manager`, with its own (ipykernel/ipkernel.py); libraries
(ipywidgets 8) only ever call those hooks. The agent does the same with:

- FrameComm, a `comm.base_comm.BaseComm` whose publish_msg sends a COMM_MESSAGE frame (buffers as
  raw bytes) instead of an IOPub message: the kernel publishes it with the request's parent;
- the `comm` package's own CommManager (the registry and the dispatch of the frontend's
  comm_open / comm_msg / comm_close to targets and callbacks, exactly as ipykernel's subclass
  of it does), reached by the hook and as `get_ipython().kernel.comm_manager`;
- `get_ipython().kernel.get_parent()`: the header of the Jupyter message being served (the
  execute_request of the cell, or the frontend's comm message whose callbacks run), as the host
  sent it. The Output widget records that msg_id and the frontend routes every output whose
  parent has it into the widget, so this must be the kernel's very header.

The host's COMM request (a frontend message) runs like a small cell: its callbacks are user code
(interruptible), their output goes out as the cell's would, and a COMM_DONE ends it. COMM_INFO
answers comm_info_request from the registry and, after the host restored an older state,
resynchronises: comms the frontend no longer has are closed here without a message, and widgets
it still has send their whole state again.
"""
from __future__ import annotations

import sys
import traceback
from typing import Any
# User code may replace builtins (`builtins.len = ...`); the agent's own code must not follow,
# so the builtins it uses are bound as this module's globals.
from builtins import bool, bytes, dict, getattr, isinstance, len, list, set, str  # noqa: A004

import comm
from comm.base_comm import BaseComm, CommManager

from . import agent_io as aio
from .frame_protocol import MAX_BUFFERS, FrameType

HEADER_FIELDS = ("msg_id", "msg_type", "session", "username", "date", "version")
KINDS = ("comm_open", "comm_msg", "comm_close")


def _as_bytes(buf: Any) -> bytes:
    """A comm buffer (bytes, bytearray, memoryview, a numpy array: anything with the buffer
    protocol) as bytes."""
    if isinstance(buf, bytes):
        return buf
    try:
        return memoryview(buf).cast("B").tobytes()
    except TypeError:
        raise TypeError(f"a comm buffer must support the buffer protocol, not {type(buf).__name__}") from None


class FrameComm(BaseComm):
    """A comm whose messages go to the host as COMM_MESSAGE frames."""

    bridge: CommBridge | None = None  # set by CommBridge.install

    def publish_msg(self, msg_type: str, data: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None,
                    buffers: list[Any] | None = None, **keys: Any) -> None:
        bridge = FrameComm.bridge
        if bridge is None:
            return  # before the agent started (nothing to send to), as ipykernel without a kernel
        raw = [_as_bytes(b) for b in buffers or ()]
        if len(raw) > MAX_BUFFERS:
            raise ValueError(f"a comm message carries at most {MAX_BUFFERS} binary buffers in the zeroboot sandbox, "
                             f"not {len(raw)}")
        payload: dict[str, Any] = {"kind": msg_type, "comm_id": self.comm_id, "data": data or {},
                                   "metadata": metadata or {}}
        if msg_type == "comm_open":
            payload["target_name"] = keys.get("target_name") or self.target_name
            if keys.get("target_module"):
                payload["target_module"] = keys["target_module"]
        bridge.channel.send(FrameType.COMM_MESSAGE, payload, raw)


class CommBridge:
    """The agent's comm state: the manager, the current parent header, the two requests."""

    def __init__(self, channel: aio.Channel, gate: aio.InterruptGate, shell: Any) -> None:
        self.channel = channel
        self.gate = gate
        self.shell = shell
        self.manager = CommManager()
        self.parent: dict[str, Any] = {}

    def install(self) -> None:
        """The `comm` package's hooks, as ipykernel installs its own, and the kernel's parts that
        libraries reach for (`kernel.comm_manager`, `kernel.get_parent()`)."""
        FrameComm.bridge = self
        comm.create_comm = _create_comm
        comm.get_comm_manager = self.get_comm_manager
        kernel = self.shell.kernel
        kernel.comm_manager = self.manager
        kernel.get_parent = self.get_parent

    def get_comm_manager(self, *args: Any, **kwargs: Any) -> CommManager:
        return self.manager

    def get_parent(self, channel: str | None = None) -> dict[str, Any]:
        """The Jupyter message being served, as ipykernel's Kernel.get_parent gives it."""
        return self.parent

    def set_parent(self, header: object) -> None:
        """The header of the kernel's message this request serves (the host's copy)."""
        if not isinstance(header, dict):
            self.parent = {}
        else:
            clean = {k: str(header[k]) for k in HEADER_FIELDS if isinstance(header.get(k), str)}
            self.parent = {"header": clean, "parent_header": {}, "metadata": {}, "content": {},
                           "msg_id": clean.get("msg_id", ""), "msg_type": clean.get("msg_type", "")}
        # ipykernel's shell keeps the same message (shell.get_parent(), which Output widgets ask first)
        self.shell.parent_header = self.parent

    # ---- COMM: a frontend message -----------------------------------------------------------

    def serve_comm(self, request: dict[str, Any]) -> None:
        """Dispatch one comm_open / comm_msg / comm_close of the frontend to the registry, as
        ipykernel's shell handlers do, then COMM_DONE."""
        self.set_parent(request.get("parent_header"))
        kind = request.get("kind")
        content: dict[str, Any] = {"comm_id": str(request.get("comm_id", "")),
                                   "data": request.get("data") if isinstance(request.get("data"), dict) else {}}
        if kind == "comm_open":
            content["target_name"] = str(request.get("target_name", ""))
            if isinstance(request.get("target_module"), str):
                content["target_module"] = request["target_module"]
        metadata = request.get("metadata") if isinstance(request.get("metadata"), dict) else {}
        header = self.parent.get("header", {})
        msg = {"header": header, "msg_id": header.get("msg_id", ""), "msg_type": kind, "parent_header": {},
               "metadata": metadata, "content": content,
               "buffers": [memoryview(b) for b in request.get("buffers") or () if isinstance(b, bytes)]}
        reply: dict[str, Any] = {"id": request.get("id"), "status": "ok"}
        handler = {"comm_open": self.manager.comm_open, "comm_msg": self.manager.comm_msg,
                   "comm_close": self.manager.comm_close}.get(kind)  # type: ignore[arg-type]
        self.gate.begin_request()
        try:
            if handler is None:
                raise ValueError(f"unknown comm message kind {str(kind)[:40]!r}")
            self.gate.enter_user_code()  # callbacks are user code: an interrupt stops them
            handler(None, None, msg)  # type: ignore[arg-type]
            self.gate.end_request()
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt from a callback too
            self.gate.end_request()
            if isinstance(exc, (SystemExit, GeneratorExit)):
                exc = RuntimeError(f"a comm callback raised {type(exc).__name__}")
            self.shell.showtraceback((type(exc), exc, exc.__traceback__))
            # the ERROR frame carried the traceback; formatting it twice would only delay the reply
            reply.update(status="error", ename=type(exc).__name__, evalue=aio.safe_str(exc), traceback=[])
        finally:
            self.gate.end_request()
        self.channel.send(FrameType.COMM_DONE, reply)

    # ---- COMM_INFO: the registry, and resynchronisation ---------------------------------

    def serve_info(self, request: dict[str, Any]) -> None:
        sync = request.get("sync")
        if isinstance(sync, list):
            self.resync({s for s in sync if isinstance(s, str)})
        target = request.get("target_name")
        comms = {cid: {"target_name": str(c.target_name)} for cid, c in list(self.manager.comms.items())
                 if not isinstance(target, str) or c.target_name == target}
        self.channel.send(FrameType.COMM_INFO_REPLY, {"id": request.get("id"), "comms": comms})

    def resync(self, frontend: set[str]) -> None:
        """The host restored a state (%rewind, a rollback): make the guest and the frontend agree.
        A comm the frontend does not have (closed after the restored state was captured) is closed
        here, silently; a widget it has sends its whole state (the frontend may show newer
        values than the restored ones)."""
        self.gate.begin_request()
        try:
            self.gate.enter_user_code()  # widget serialisers are user code
            for cid, c in list(self.manager.comms.items()):
                if cid not in frontend:
                    c._closed = True
                    self.manager.comms.pop(cid, None)
                    widget = _widget_of(cid)
                    if widget is not None:
                        widget.close()  # its comm is marked closed: ipywidgets' bookkeeping, no message
                    continue
                widget = _widget_of(cid)
                if widget is not None:
                    try:
                        widget.send_state()
                    except Exception:  # noqa: BLE001 - one widget's state must not stop the others
                        aio.log(f"resync of widget {cid}: " + traceback.format_exc(limit=3))
        except KeyboardInterrupt:
            pass
        finally:
            self.gate.end_request()


def _create_comm(*args: Any, **kwargs: Any) -> BaseComm:
    return FrameComm(*args, **kwargs)


def _widget_of(comm_id: str) -> Any:
    """The ipywidgets Widget whose comm this is, if ipywidgets is in use."""
    module = sys.modules.get("ipywidgets.widgets.widget")
    if module is None:
        return None
    registry = getattr(module, "_instances", None)  # ipywidgets 8: model id -> Widget
    return registry.get(comm_id) if isinstance(registry, dict) else None
