"""Item 4b of issue 11: the engine server turns any exception inside one request into an error
reply for that request, and serves the next one (it caught only ZerobootError, so a
RecursionError from one cell's output ended the engine and the session). No VM needed."""
from __future__ import annotations

import socket
import threading

from zeroboot_kernel import engine_wire as wire
from zeroboot_kernel.engine_server import EngineServer


class FailingSession:
    """What a session whose requests blow up in unexpected ways looks like to the server."""

    def diff(self):
        raise RecursionError("maximum recursion depth exceeded")

    def stats(self):
        return {"ok": True}

    def describe_checkpoints(self):
        raise KeyError("boom")

    def export_chunk(self, *args):
        raise MemoryError()

    def prepare_next_cell(self):
        pass

    def runs_between_cells(self):
        raise LookupError("between requests, too")  # must not end the server either


def test_any_exception_in_a_request_is_that_requests_error():
    ours, theirs = socket.socketpair()
    ours.settimeout(60)  # a server that died must fail the test, not hang it
    server = EngineServer(theirs, FailingSession())  # type: ignore[arg-type]
    done = threading.Event()

    def serve():
        try:
            server.serve()
        except SystemExit:
            pass
        finally:
            done.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        replies = {}
        for rid, op, extra in [(1, "diff", {}), (2, "checkpoints", {}), (3, "export_chunk",
                               {"path": "x", "parts": [], "offset": 0, "size": 1}),
                               (4, "export_chunk", {"path": "x", "parts": "nope", "offset": 0, "size": 1}),
                               (5, "stats", {})]:
            wire.send(ours, {"op": op, "id": rid, **extra})
            msg = wire.recv(ours)
            assert msg["event"] == "reply" and msg["id"] == rid
            replies[op, rid] = msg["content"]
        assert replies["diff", 1]["status"] == "error" and replies["diff", 1]["ename"] == "RecursionError"
        assert replies["checkpoints", 2]["ename"] == "KeyError"
        assert replies["export_chunk", 3]["ename"] == "MemoryError"
        assert replies["export_chunk", 4]["ename"] == "ValueError"
        assert replies["stats", 5] == {"status": "ok", "stats": {"ok": True}}
        wire.send(ours, {"op": "shutdown", "id": 6})
        assert done.wait(10)
    finally:
        ours.close()
        theirs.close()
