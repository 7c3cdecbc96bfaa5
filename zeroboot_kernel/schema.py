"""Checks of values that come from the guest, before anything on the host uses them.

User code in a cell can write frames in the agent's place (docs/SECURITY.md), so every frame
payload is checked against the shape the agent sends (docs/PROTOCOL.md): types, sizes, depth.
The engine checks guest frames (frames.decode); the kernel checks the engine's events and
replies again (check_event, check_reply), since they carry guest data through a second parser.
A value that fails raises SchemaError (a ValueError): the caller turns it into an error of that
cell or request, never an exception of the kernel.
"""
from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 64                 # nesting of JSON containers in one payload
MAX_MIME_TYPES = 64            # entries of one display data bundle
MAX_TRACEBACK = 10_000         # lines of one traceback
MAX_MATCHES = 100_000          # completion matches
MAX_PAYLOADS = 64
MIME_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$")
PAYLOAD_SOURCES = ("page", "set_next_input", "edit_magic", "ask_exit")
# Comms (widgets): the ids the frontend and the kernel use are uuid hex or uuid strings; the guest
# may choose its own, within this alphabet, which IOPub topics (b"comm-<id>") and logs can carry.
COMM_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
COMM_KINDS = ("comm_open", "comm_msg", "comm_close")
MAX_TARGET_NAME = 256
MAX_COMMS = 10_000             # entries of one comm registry (comm_info_reply)


class SchemaError(ValueError):
    """A value from the guest (or the engine) does not have the expected shape."""


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True if `value` (decoded JSON) nests at most `limit` containers deep. Iterative: the
    value's depth is the guest's choice."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            if d > limit:
                return False
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            if d > limit:
                return False
            stack.extend((x, d + 1) for x in v)
    return True


def check_depth(value: Any, what: str = "value") -> Any:
    if not depth_ok(value):
        raise SchemaError(f"{what} nests more than {MAX_DEPTH} levels deep")
    return value


# ---- primitives ----

def _str(p: dict[str, Any], key: str, default: str | None = None) -> str:
    v = p.get(key, default)
    if not isinstance(v, str):
        raise SchemaError(f"{key!r} must be a string")
    return v


def _bool(p: dict[str, Any], key: str, default: bool = False) -> bool:
    v = p.get(key, default)
    if not isinstance(v, bool):
        raise SchemaError(f"{key!r} must be true or false")
    return v


def _int(p: dict[str, Any], key: str, default: int | None = None, *, optional: bool = False) -> int | None:
    v = p.get(key, default)
    if v is None and optional:
        return None
    if type(v) is not int or not -(2**63) <= v < 2**63:
        raise SchemaError(f"{key!r} must be an integer")
    return v


def check_int(p: dict[str, Any], key: str) -> int:
    """An integer field that must be present (not a bool)."""
    value = _int(p, key)
    if value is None:  # _int refuses a missing value unless optional; this keeps the type exact
        raise SchemaError(f"{key!r} must be an integer")
    return value


def _obj(p: dict[str, Any], key: str) -> dict[str, Any]:
    v = p.get(key, {})
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise SchemaError(f"{key!r} must be an object")
    return v


def _strings(p: dict[str, Any], key: str, limit: int) -> list[str]:
    v = p.get(key, [])
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > limit or not all(isinstance(x, str) for x in v):
        raise SchemaError(f"{key!r} must be a list of at most {limit} strings")
    return v


def mime_bundle(p: dict[str, Any], key: str = "data") -> dict[str, Any]:
    """A display data bundle: MIME type -> a string, or JSON (for JSON-based MIME types)."""
    data = _obj(p, key)
    if len(data) > MAX_MIME_TYPES:
        raise SchemaError(f"{key!r} holds more than {MAX_MIME_TYPES} MIME types")
    for mime, value in data.items():
        if not MIME_TYPE.match(mime):
            raise SchemaError(f"{key!r} has a key that is not a MIME type: {mime[:80]!r}")
        if not isinstance(value, str) and "json" not in mime.lower():  # JSON types: any JSON value
            raise SchemaError(f"{key!r}[{mime!r}] must be a string")
    return data


def _metadata(p: dict[str, Any]) -> dict[str, Any]:
    md = _obj(p, "metadata")
    if not all(isinstance(k, str) for k in md):
        raise SchemaError("'metadata' keys must be strings")
    return md


def _transient(p: dict[str, Any]) -> dict[str, Any]:
    t = _obj(p, "transient")
    if "display_id" in t and not isinstance(t["display_id"], str):
        raise SchemaError("'transient.display_id' must be a string")
    return {"display_id": t["display_id"]} if "display_id" in t else {}


def error_fields(p: dict[str, Any]) -> dict[str, Any]:
    return {"ename": _str(p, "ename", "Error"), "evalue": _str(p, "evalue", ""),
            "traceback": _strings(p, "traceback", MAX_TRACEBACK)}


def user_expressions(p: dict[str, Any]) -> dict[str, Any]:
    ue = _obj(p, "user_expressions")
    out: dict[str, Any] = {}
    for name, value in ue.items():
        if not isinstance(value, dict):
            raise SchemaError("'user_expressions' values must be objects")
        status = _str(value, "status", "error")
        if status == "ok":
            out[name] = {"status": "ok", "data": mime_bundle(value), "metadata": _metadata(value)}
        else:
            out[name] = {"status": "error", **error_fields(value)}
    return out


def payloads(p: dict[str, Any]) -> list[dict[str, Any]]:
    """execute_reply payloads: only the kinds IPython sends that a guest may ask the frontend for."""
    v = p.get("payload", [])
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > MAX_PAYLOADS or not all(isinstance(x, dict) for x in v):
        raise SchemaError("'payload' must be a list of objects")
    # ask_exit (exit()/quit()) carries one flag: the kernel acts on it, so only a real bool counts
    return [{"source": "ask_exit", "keepkernel": x.get("keepkernel") is True} if x.get("source") == "ask_exit" else x
            for x in v if x.get("source") in PAYLOAD_SOURCES]


def asks_exit(payload: list[dict[str, Any]]) -> bool:
    """A reply's checked payloads (payloads()) hold exit() without keep_kernel: under ipykernel the
    kernel ends after this reply."""
    return any(p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payload)


# ---- guest frames (by type; see frames.FrameType) ----

def stream(p: dict[str, Any]) -> dict[str, Any]:
    name = _str(p, "name", "stdout")
    if name not in ("stdout", "stderr"):
        raise SchemaError("'name' must be stdout or stderr")
    return {"name": name, "text": _str(p, "text", "")}


def display(p: dict[str, Any]) -> dict[str, Any]:
    return {"data": mime_bundle(p), "metadata": _metadata(p), "transient": _transient(p),
            "update": _bool(p, "update")}


def result(p: dict[str, Any]) -> dict[str, Any]:
    return {"data": mime_bundle(p), "metadata": _metadata(p),
            "execution_count": _int(p, "execution_count", None, optional=True)}


def error(p: dict[str, Any]) -> dict[str, Any]:
    return error_fields(p)


def clear_output(p: dict[str, Any]) -> dict[str, Any]:
    return {"wait": _bool(p, "wait")}


def input_request(p: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": _str(p, "prompt", ""), "password": _bool(p, "password")}


def done(p: dict[str, Any]) -> dict[str, Any]:
    """The agent's execute_reply: only the fields of an execute_reply, checked."""
    status = _str(p, "status", "error")
    out: dict[str, Any] = {"id": _int(p, "id"), "status": "ok" if status == "ok" else "error",
                           "execution_count": _int(p, "execution_count", None, optional=True),
                           "user_expressions": user_expressions(p), "payload": payloads(p)}
    if out["status"] == "error":
        out.update(error_fields(p))
    return out


def complete_reply(p: dict[str, Any]) -> dict[str, Any]:
    return {"id": _int(p, "id"), "status": "ok", "matches": _strings(p, "matches", MAX_MATCHES),
            "cursor_start": _int(p, "cursor_start", 0), "cursor_end": _int(p, "cursor_end", 0),
            "metadata": _metadata(p)}


def inspect_reply(p: dict[str, Any]) -> dict[str, Any]:
    return {"id": _int(p, "id"), "status": "ok", "found": _bool(p, "found"), "data": mime_bundle(p),
            "metadata": _metadata(p)}


def comm_id(p: dict[str, Any], key: str = "comm_id") -> str:
    v = p.get(key)
    if not isinstance(v, str) or not COMM_ID.match(v):
        raise SchemaError(f"{key!r} must be a comm id (1-128 letters, digits, '_', '.', ':', '-'), "
                          f"not {str(v)[:80]!r}")
    return v


def _target_name(p: dict[str, Any], key: str) -> str:
    v = _str(p, key, "")
    if not 0 < len(v) <= MAX_TARGET_NAME or any(ord(c) < 32 for c in v):
        raise SchemaError(f"{key!r} must be 1-{MAX_TARGET_NAME} printable characters")
    return v


def comm_message(p: dict[str, Any]) -> dict[str, Any]:
    """A comm_open / comm_msg / comm_close the guest sends the frontend (its buffers come apart,
    frames.decode): the message content's fields, checked."""
    kind = _str(p, "kind", "")
    if kind not in COMM_KINDS:
        raise SchemaError(f"'kind' must be one of {COMM_KINDS}")
    out: dict[str, Any] = {"kind": kind, "comm_id": comm_id(p), "data": _obj(p, "data"), "metadata": _metadata(p)}
    if kind == "comm_open":
        out["target_name"] = _target_name(p, "target_name")
        module = p.get("target_module")
        if module is not None:
            out["target_module"] = _target_name(p, "target_module")
    return out


def comm_done(p: dict[str, Any]) -> dict[str, Any]:
    """The end of a frontend comm message's work in the guest."""
    status = _str(p, "status", "error")
    out: dict[str, Any] = {"id": _int(p, "id"), "status": "ok" if status == "ok" else "error"}
    if out["status"] == "error":
        out.update(error_fields(p))
    return out


def comm_registry(p: dict[str, Any]) -> dict[str, dict[str, str]]:
    """comm_info_reply's `comms`: {comm id: {"target_name": str}}."""
    comms = _obj(p, "comms")
    if len(comms) > MAX_COMMS:
        raise SchemaError(f"'comms' holds more than {MAX_COMMS} comms")
    out: dict[str, dict[str, str]] = {}
    for key, value in comms.items():
        if not COMM_ID.match(key) or not isinstance(value, dict):
            raise SchemaError(f"'comms' has an entry that is not comm id -> object: {key[:80]!r}")
        out[key] = {"target_name": _target_name(value, "target_name")}
    return out


def comm_info_reply(p: dict[str, Any]) -> dict[str, Any]:
    return {"id": _int(p, "id"), "status": "ok", "comms": comm_registry(p)}


MAX_BUFFERS_BASE64 = 64        # buffers of one comm event (frame_protocol.MAX_BUFFERS)


def comm_event(ev: dict[str, Any]) -> dict[str, Any]:
    """A comm event from the engine: the checked message, its buffers as base64 strings."""
    out = comm_message(_obj(ev, "content"))
    buffers = ev.get("buffers", [])
    if not isinstance(buffers, list) or len(buffers) > MAX_BUFFERS_BASE64 or \
            not all(isinstance(b, str) for b in buffers):
        raise SchemaError(f"'buffers' must be a list of at most {MAX_BUFFERS_BASE64} base64 strings")
    return {"event": "comm", "content": out, "buffers": buffers}


# ---- the engine's events and replies, as the kernel receives them ----

OUTPUT_EVENTS = {"display_data": display, "update_display_data": display, "execute_result": result,
                 "error": error, "clear_output": clear_output}


def session_reply(p: dict[str, Any]) -> dict[str, Any]:
    """The agent's answer to SESSION (agent_session.start_session): how many variables it set and
    the locale it could select; an error carries error fields."""
    status = _str(p, "status", "error")
    out: dict[str, Any] = {"id": _int(p, "id"), "status": "ok" if status == "ok" else "error"}
    if out["status"] == "ok":
        out["variables"] = _int(p, "variables", 0)
        out["locale"] = _str(p, "locale", "")
    else:
        out.update(error_fields(p))
    return out


# The engine's events for what a guest thread or asyncio task printed, and the comm messages
# (widget updates) it sent, while no request ran: they carry no request id (EngineClient hands
# them to on_idle_stream / on_idle_comm whenever they come, the kernel publishes them live).
IDLE_STREAM = "idle_stream"
IDLE_COMM = "idle_comm"


def idle_stream_event(ev: dict[str, Any]) -> tuple[str, str]:
    """An IDLE_STREAM event, checked: (name, text)."""
    checked = stream(ev)
    return checked["name"], checked["text"]


def check_event(ev: dict[str, Any]) -> dict[str, Any]:
    """An engine event of a running request, checked: {"event": kind, ...fields}."""
    kind = ev.get("event")
    if not isinstance(kind, str):
        raise SchemaError("an engine event without a kind")
    if kind == "stream":
        return {"event": kind, **stream(ev)}
    if kind in OUTPUT_EVENTS:
        content = OUTPUT_EVENTS[kind](_obj(ev, "content"))
        if kind in ("display_data", "update_display_data"):
            content.pop("update", None)
        if kind == "execute_result":
            content.pop("execution_count", None)  # the kernel's own count goes in
        return {"event": kind, "content": content}
    if kind == "input_request":
        return {"event": kind, **input_request(ev)}
    if kind == "log":
        return {"event": kind, "text": _str(ev, "text", "")}
    if kind == "comm":
        return comm_event(ev)
    raise SchemaError(f"unknown engine event {str(kind)[:40]!r}")


def execute_reply(content: dict[str, Any]) -> dict[str, Any]:
    """The engine's reply to an execute request, checked (status, user_expressions, payload,
    and the error fields)."""
    status = _str(content, "status", "error")
    out: dict[str, Any] = {"status": "ok" if status == "ok" else "error",
                           "user_expressions": user_expressions(content), "payload": payloads(content)}
    if out["status"] == "error":
        out.update(error_fields(content))
    return out
