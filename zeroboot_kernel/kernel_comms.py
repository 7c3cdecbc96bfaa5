"""Jupyter comms (widgets) on the kernel side: the guest's comm messages on IOPub, the frontend's
comm messages to the guest, comm_info_request, and keeping the frontend's comms in step with the
guest when the sandbox goes back to an older state (docs/ARCHITECTURE.md, "Comms").

The guest owns the comm registry (agent_comm.py); the kernel keeps only the set of comm ids the
frontend has been told are open (`frontend`), so that after a rollback, a %rewind, a reset or an
isolated cell it can ask the guest to resynchronise (COMM_INFO with `sync`) and close on the
frontend the comms the guest no longer has: the page never shows a widget the kernel does not
have. Everything in a comm event came from the guest and was checked twice (frames.decode in the
engine, schema.check_event here); the parent of every IOPub message is the kernel's own request,
never a value from the guest.
"""
from __future__ import annotations

import base64
import binascii
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from . import engine_requests as req
from . import schema

if TYPE_CHECKING:
    from .engine_client import EngineClient

log = logging.getLogger(__name__)

FRONTEND_KINDS = ("comm_open", "comm_msg", "comm_close")
HEADER_FIELDS = ("msg_id", "msg_type", "session", "username", "date", "version")
MAX_FRONTEND_BUFFERS = 64          # frame_protocol.MAX_BUFFERS: what one COMM frame can carry
MAX_FRONTEND_BYTES = 15 << 20      # of buffers in one frontend message (a frame holds 16 MiB)

Publish = Callable[[dict[str, Any], str, dict[str, Any], dict[str, Any], bytes, list[bytes]], None]
# `%sandbox outputs safe` promises that no script reaches the browser; a widget's model can carry
# HTML (ipywidgets.HTML, description_allow_html) that the widget manager renders as it is.
SAFE_NOTE = ("[zeroboot] widgets are not sent to the browser while outputs are 'safe' (%sandbox outputs): a "
             "widget can put HTML and script on the page. `%sandbox outputs trusted` lets them through. "
             "(Told once per session.)\n")


class CommRefused(ValueError):
    """A frontend comm message the kernel cannot forward (malformed, too large)."""


def header_of(parent: dict[str, Any]) -> dict[str, str]:
    """The parts of a Jupyter message's header the guest sees (get_parent()["header"]), as text."""
    header = parent.get("header") if isinstance(parent, dict) else None
    if not isinstance(header, dict):
        return {}
    return {k: (v if isinstance(v, str) else v.isoformat() if hasattr(v, "isoformat") else str(v))
            for k, v in header.items() if k in HEADER_FIELDS}


def frontend_message(parent: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The fields of the engine's `comm` request for a frontend comm message, and its buffers
    as base64. CommRefused for what the guest must not be sent."""
    msg_type = parent.get("header", {}).get("msg_type")
    content = parent.get("content")
    if msg_type not in FRONTEND_KINDS or not isinstance(content, dict):
        raise CommRefused("not a comm message")
    try:
        fields: dict[str, Any] = {"kind": msg_type, "comm_id": schema.comm_id(content)}
        if msg_type == "comm_open":
            fields["target_name"] = schema._target_name(content, "target_name")
            if isinstance(content.get("target_module"), str):
                fields["target_module"] = content["target_module"]
    except schema.SchemaError as exc:
        raise CommRefused(str(exc)) from None
    data = content.get("data", {})
    metadata = parent.get("metadata", {})
    fields["data"] = data if isinstance(data, dict) else {}
    fields["metadata"] = metadata if isinstance(metadata, dict) else {}
    raw = [bytes(b) for b in parent.get("buffers") or ()]
    if len(raw) > MAX_FRONTEND_BUFFERS or sum(len(b) for b in raw) > MAX_FRONTEND_BYTES:
        raise CommRefused(f"a comm message may carry at most {MAX_FRONTEND_BUFFERS} buffers of "
                          f"{MAX_FRONTEND_BYTES >> 20} MiB in all to the sandbox")
    fields["parent_header"] = header_of(parent)
    return fields, [base64.b64encode(b).decode("ascii") for b in raw]


class CommRouter:
    """The kernel's view of the comms: which ones the frontend has, and their IOPub messages."""

    MAX_FRONTEND = schema.MAX_COMMS

    def __init__(self, publish: Publish, blocked: Callable[[], bool] = lambda: False,
                 notify: Callable[[dict[str, Any], str], None] = lambda parent, text: None) -> None:
        self.publish = publish
        self.blocked = blocked      # True: guest comm messages must not reach the browser (safe outputs)
        self.notify = notify        # (parent, text): a note on the request's stderr
        self.told_blocked = False
        self.frontend: dict[str, str] = {}  # comm id -> target name, open on the frontend
        self.used = False  # a comm was ever opened: the guest may hold comms the frontend lacks
        # a request's thread and, between cells, the idle channel's reader (a widget updated in
        # the background) both change `frontend`
        self._lock = threading.RLock()

    def guest_message(self, parent: dict[str, Any], ev: dict[str, Any]) -> None:
        """A checked `comm` event (schema.comm_event): publish it on IOPub under `parent`."""
        with self._lock:
            self._guest_message(parent, ev)

    def _guest_message(self, parent: dict[str, Any], ev: dict[str, Any]) -> None:
        message = ev["content"]
        kind, comm_id = message["kind"], message["comm_id"]
        if self.blocked():
            if not self.told_blocked:
                self.told_blocked = True
                self.notify(parent, SAFE_NOTE)
            return
        try:
            buffers = [base64.b64decode(b, validate=True) for b in ev.get("buffers") or ()]
        except (binascii.Error, ValueError):
            log.error("zeroboot: dropped a comm message with malformed buffers from the engine")
            return
        content: dict[str, Any] = {"comm_id": comm_id, "data": message["data"]}
        if kind == "comm_open":
            if comm_id not in self.frontend and len(self.frontend) >= self.MAX_FRONTEND:
                log.error("zeroboot: the guest opened more than %d comms; comm_open dropped", self.MAX_FRONTEND)
                return
            content["target_name"] = message["target_name"]
            content["target_module"] = message.get("target_module")  # ipykernel sends null too
            self.frontend[comm_id] = message["target_name"]
            self.used = True
        elif kind == "comm_close":
            self.frontend.pop(comm_id, None)
        self.publish(parent, kind, content, message["metadata"], f"comm-{comm_id}".encode("ascii"), buffers)

    def frontend_message(self, parent: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """A frontend comm message to forward: noted (an open or close changes what the frontend
        has), then its engine request fields."""
        fields, buffers = frontend_message(parent)
        with self._lock:
            if fields["kind"] == "comm_open" and len(self.frontend) < self.MAX_FRONTEND:
                self.frontend[fields["comm_id"]] = fields["target_name"]
                self.used = True
            elif fields["kind"] == "comm_close":
                self.frontend.pop(fields["comm_id"], None)
        return fields, buffers

    def close_on_frontend(self, parent: dict[str, Any], comm_ids: list[str]) -> None:
        """comm_close on IOPub for comms the guest does not have (any more)."""
        with self._lock:
            for comm_id in comm_ids:
                if self.frontend.pop(comm_id, None) is not None:
                    self.publish(parent, "comm_close", {"comm_id": comm_id, "data": {}}, {},
                                 f"comm-{comm_id}".encode("ascii"), [])

    def resync(self, client: EngineClient, parent: dict[str, Any]) -> None:
        """After the sandbox went back to an older state (engine lock held): the guest closes the
        comms the frontend does not have and sends the state of the widgets it has; the frontend's
        comms the guest does not have are closed on IOPub."""
        if not self.used:
            return  # no comm was ever opened: nothing to agree on
        comms: dict[str, Any] | None = None
        for ev in client.request(req.COMM_INFO, sync=list(self.frontend)):
            if ev["event"] == "comm":
                self.guest_message(parent, ev)
            elif ev["event"] == "reply":
                content = ev["content"]
                if content.get("status") == "ok":
                    try:
                        comms = schema.comm_registry(content)
                    except schema.SchemaError as exc:
                        log.error("zeroboot: malformed comm registry from the engine: %s", exc)
        # a guest that could not answer keeps nothing the page could talk to
        with self._lock:
            stale = [c for c in self.frontend if comms is None or c not in comms]
        self.close_on_frontend(parent, stale)
