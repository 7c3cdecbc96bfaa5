"""Property tests (hypothesis) of the kernel-side decoding of what the guest and the engine send:
guest frame payloads (frames.decode), the engine's binary listings (listing.py), messages on the
engine channel (engine_wire.recv), engine events and replies (schema.py, EngineClient), export
plans and chunks (export.py). Whatever the bytes, decoding either gives a value of the promised
shape, which the engine can send on, or raises the module's ValueError; never anything else.
Brief enough for CI (a few seconds); HYPOTHESIS_PROFILE=long runs more examples."""
from __future__ import annotations

import json
import os
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from zeroboot_kernel import engine_wire, export, frames, listing, schema
from zeroboot_kernel.engine_client import EngineClient

pytestmark = pytest.mark.without_kvm  # decoders fed bytes, no guest

settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

json_leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=30)
mime = st.sampled_from(["text/plain", "text/html", "image/png", "application/json", "application/javascript",
                        "not a mime", "", "x/y"])
payload_like = st.fixed_dictionaries({}, optional={
    "id": json_values | st.integers(0, 10), "name": st.sampled_from(["stdout", "stderr", "x"]) | json_values,
    "text": st.text() | json_values, "data": st.dictionaries(mime, json_values, max_size=3) | json_values,
    "metadata": json_values, "transient": json_values, "update": json_values, "status": json_values,
    "execution_count": json_values, "ename": json_values, "evalue": json_values, "traceback": json_values,
    "user_expressions": json_values, "payload": json_values, "matches": json_values, "found": json_values,
    "wait": json_values, "prompt": json_values, "password": json_values, "root": json_values, "items": json_values,
})
frame_types = st.sampled_from([int(t) for t in frames.FrameType] + [0, 99, 110, 65535])


def sendable(value) -> None:
    """What decode accepted, the engine can put on its channel (bounded depth, JSON)."""
    body = engine_wire.encode({"event": "display_data", "id": 1, "content": value})
    assert json.loads(body[4:]) is not None


@given(frame_types, st.binary(max_size=300))
def test_frames_decode_arbitrary_bytes(ftype, data):
    try:
        sendable(frames.decode(ftype, data))
    except ValueError:
        pass


@given(frame_types, payload_like)
def test_frames_decode_checks_the_shape(ftype, payload):
    try:
        p = frames.decode(ftype, json.dumps(payload).encode())
    except ValueError:
        return
    sendable(p)
    if ftype == frames.FrameType.STREAM:
        assert p["name"] in ("stdout", "stderr") and isinstance(p["text"], str)
    elif ftype in (frames.FrameType.DISPLAY, frames.FrameType.RESULT):
        assert isinstance(p["data"], dict) and all(schema.MIME_TYPE.match(k) for k in p["data"])
        assert isinstance(p["metadata"], dict)
    elif ftype == frames.FrameType.DONE:
        assert set(p) <= {"id", "status", "execution_count", "user_expressions", "payload", "ename", "evalue",
                          "traceback"}
        assert type(p["id"]) is int and p["status"] in ("ok", "error")
        assert all(x.get("source") in schema.PAYLOAD_SOURCES for x in p["payload"])
    elif ftype == frames.FrameType.ERROR:
        assert all(isinstance(line, str) for line in p["traceback"])


@given(st.integers(1, 3000))
def test_deep_nesting_is_refused_at_decode(depth):
    body = ('{"data": {"application/json": ' + "[" * depth + "1" + "]" * depth + "}}").encode()
    try:
        p = frames.decode(frames.FrameType.DISPLAY, body)
    except ValueError:
        assert depth > schema.MAX_DEPTH - 2
        return
    sendable(p)


def entry_record(kind: int, size: int, name: bytes) -> bytes:
    return struct.pack("<BQH", kind, size, len(name)) + name


names = st.binary(min_size=1, max_size=255).filter(lambda b: b not in (b".", b"..") and b"/" not in b and b"\0" not in b)


@given(st.lists(st.tuples(st.sampled_from(list(listing.KINDS)), st.integers(0, 2**64 - 1), names), max_size=8))
def test_listing_round_trip(rows):
    data = b"".join(entry_record(k, s, n) for k, s, n in rows)
    got = listing.decode_entries(data)
    assert [(e.kind, e.name.encode("utf-8", "surrogateescape")) for e in got] == [(listing.KINDS[k], n) for k, _, n in rows]


@given(st.binary(max_size=400))
def test_listing_decode_arbitrary_bytes(data):
    try:
        entries = listing.decode_entries(data)
    except listing.ListingError:
        return
    for e in entries:
        assert listing.check_name(e.name) and e.kind in listing.KINDS.values()


@given(st.binary(max_size=400))
def test_diff_decode_arbitrary_bytes(data):
    try:
        changes = listing.decode_diff(data)
    except listing.ListingError:
        return
    for tag, rel in changes:
        assert tag in listing.TAGS.values()
        assert all(listing.check_name(p) for p in rel.split("/"))


@given(st.text())
def test_printable_names_have_no_control_characters(name):
    shown = listing.printable(name)
    assert not any(ord(c) < 0x20 or c in "\x7f\u202e\u2028" for c in shown)


@given(st.binary(max_size=200))
def test_engine_channel_messages(body):
    a, b = socket.socketpair()
    try:
        a.sendall(struct.pack("<I", len(body)) + body)
        try:
            msg = engine_wire.recv(b)
        except engine_wire.BadMessage:
            return
        assert isinstance(msg, dict) and schema.depth_ok(msg, engine_wire.MAX_DEPTH)
    finally:
        a.close()
        b.close()


@given(st.dictionaries(st.sampled_from(["event", "content", "name", "text", "prompt", "password", "id"]),
                       json_values | st.sampled_from(["stream", "display_data", "execute_result", "error",
                                                      "clear_output", "input_request", "log", "reply"]), max_size=6))
def test_engine_events(ev):
    try:
        checked = schema.check_event(ev)
    except schema.SchemaError:
        return
    sendable(checked)
    if checked["event"] == "stream":
        assert isinstance(checked["text"], str)
    elif checked["event"] in ("display_data", "execute_result"):
        assert isinstance(checked["content"]["data"], dict)


@given(payload_like)
def test_execute_replies(content):
    try:
        reply = schema.execute_reply(content)
    except schema.SchemaError:
        return
    assert reply["status"] in ("ok", "error") and "root" not in reply and "items" not in reply
    sendable(reply)


plan_rows = st.lists(st.fixed_dictionaries({"parts": st.lists(st.sampled_from(["a", "b", "..", ".", "", "x/y", "\0"])
                                                             | json_values, max_size=3) | json_values,
                                            "kind": st.sampled_from(["d", "f", "l", "o", "x"]) | json_values,
                                            "size": st.integers(-5, 3 << 30) | json_values}), max_size=6)


@given(plan_rows | json_values)
def test_export_plans(rows):
    try:
        plan = export.plan_from_wire(rows)
    except (export.ExportError, listing.ListingError):
        return
    seen_dirs = set()
    for e in plan:
        assert all(listing.check_name(p) for p in e.parts)
        assert not e.parts or e.parts[:-1] in seen_dirs
        if e.kind == "d":
            seen_dirs.add(e.parts)


@given(json_values, st.integers(0, 100))
def test_export_chunks(reply, asked):
    try:
        data = export.chunk_from_wire(reply, asked)
    except export.ExportError:
        return
    assert len(data) <= asked


# ---- EngineClient: replies matched by id, anything else dropped ----

def fake_client() -> tuple[EngineClient, socket.socket]:
    """An EngineClient talking to a socket this test plays the engine on."""
    ours, theirs = socket.socketpair()
    client = EngineClient.__new__(EngineClient)
    client.sock = ours
    client._send_lock = threading.Lock()
    client._next_id = 0
    client.proc = None  # type: ignore[assignment]
    return client, theirs


noise = st.lists(st.one_of(
    st.fixed_dictionaries({"event": st.just("reply"), "id": st.integers(-3, 3) | st.none() | st.text(max_size=3),
                           "content": json_values}),
    st.fixed_dictionaries({"event": st.sampled_from(["stream", "display_data", "bogus"]),
                           "id": st.integers(-3, 3) | st.none(), "content": json_values, "text": json_values}),
), max_size=6)


@given(noise, noise)
def test_the_client_takes_only_its_own_reply(before, during):
    client, engine = fake_client()
    try:
        own = {"event": "reply", "id": 1, "content": {"status": "ok", "marker": "mine"}}
        # before: stale ones from an abandoned request; only the real reply of request 1 has its id
        for msg in [m for m in before + during if not (m.get("id") == 1 and m.get("event") == "reply")] + [own]:
            engine_wire.send(engine, msg)
        got = list(client.request("stats"))
        assert got[-1] == {"event": "reply", "content": own["content"]}
        for ev in got[:-1]:  # events of request 1 that passed the schema
            assert ev["event"] in ("stream", "display_data")
        sent = engine_wire.recv(engine)
        assert sent == {"op": "stats", "id": 1}
    finally:
        client.sock.close()
        engine.close()


def test_a_stale_reply_is_never_taken_for_the_next_request():
    client, engine = fake_client()
    try:
        engine_wire.send(engine, {"event": "stream", "id": 1, "name": "stdout", "text": "late output of cell 1"})
        engine_wire.send(engine, {"event": "reply", "id": 1, "content": {"status": "ok", "root": "/"}})
        engine_wire.send(engine, {"event": "reply", "id": 2, "content": {"status": "ok", "entries": []}})
        client._next_id = 1  # request 1 was abandoned
        assert client.call("export_list", path="x") == {"status": "ok", "entries": []}
    finally:
        client.sock.close()
        engine.close()


def test_a_malformed_message_on_the_channel_is_dropped():
    client, engine = fake_client()
    try:
        for body in (b"not json", b"[1, 2]", b"[" * 5000 + b"]" * 5000):
            engine.sendall(struct.pack("<I", len(body)) + body)
        engine_wire.send(engine, {"event": "reply", "id": 1, "content": {"status": "ok"}})
        assert client.call("stats") == {"status": "ok"}
    finally:
        client.sock.close()
        engine.close()


@pytest.mark.parametrize("value", [float("nan"), {"a": object()}])
def test_the_engine_encodes_odd_values_without_dying(value):
    engine_wire.encode({"event": "reply", "id": 1, "content": {"v": value}})
    deep: list = []
    cur = deep
    for _ in range(engine_wire.MAX_DEPTH + 5):
        cur.append([])
        cur = cur[0]
    with pytest.raises(ValueError):
        engine_wire.encode({"v": deep})
