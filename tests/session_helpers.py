"""Running one cell in a Session (zeroboot_kernel.session) and collecting what it printed; running
it between cells as the engine server does; counting the snapshot stores the engine (in this
process) holds."""
from __future__ import annotations

import os
import threading

from zeroboot_kernel.session import Session


def cell(s: Session, code: str, n: int = 1) -> dict:
    """The cell's reply, with "stdout" (all stream text) and "result" (the execute_result's
    text/plain, or None) added."""
    out: list[str] = []
    results: list[dict] = []
    reply = s.execute(code, execution_count=n, on_stream=lambda name, t: out.append(t),
                      on_message=lambda mt, c: results.append(c) if mt == "execute_result" else None)
    reply["stdout"] = "".join(out)
    reply["result"] = results[0]["data"]["text/plain"] if results else None
    return reply


def ok(reply: dict) -> str:
    """The stdout of a cell() reply that must have succeeded."""
    assert reply["status"] == "ok", reply
    return reply["stdout"]


def run(s: Session, code: str, n: int, stderr: list[str] | None = None) -> dict:
    """One cell as the engine server runs it (execute, then prepare_next_cell): its reply with
    "stdout" added; stderr text goes to `stderr` when given (else into "stdout" too)."""
    out: list[str] = []
    reply = s.execute(code, execution_count=n,
                      on_stream=lambda name, text: (stderr if name == "stderr" and stderr is not None else out).append(text))
    s.prepare_next_cell()
    reply["stdout"] = "".join(out)
    return reply


def snapshot_stores() -> int:
    """memfds of snapshot stores open in this process (the engine runs in it)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "zeroboot-snapshot" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return n


class Safety:
    """Kicks the sandbox after `seconds` so that a test of a run that should end by itself cannot
    hang; `fired` says whether it had to (the test then fails)."""

    def __init__(self, s: Session, seconds: float = 60.0) -> None:
        self.fired = False
        self.timer = threading.Timer(seconds, self._fire, args=(s,))
        self.timer.start()

    def _fire(self, s: Session) -> None:
        self.fired = True
        s.sandbox.guest.kick()

    def __enter__(self) -> "Safety":
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()


def between_cells_until_idle(s: Session, why: str = "the run between cells did not end by itself") -> None:
    """Session.between_cells with no request coming: it must end by itself (the guest's threads
    and tasks all wait for something only a request brings), else the test fails with `why`."""
    with Safety(s) as safety:
        s.between_cells(lambda: safety.fired)
    assert not safety.fired, why


class RequestArrival:
    """What the engine server's socket does when a request arrives between cells: `arrived` is
    set (the run's request_waiting) and the run is kicked. Call it, or `after(seconds)`."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self.arrived = threading.Event()

    def __call__(self) -> None:
        self.arrived.set()
        self.s.sandbox.guest.kick()

    def after(self, seconds: float) -> None:
        threading.Timer(seconds, self).start()
