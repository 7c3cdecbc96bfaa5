"""Run a guest program to completion, streaming its output: the back end of `zeroboot-kernel run`."""
from __future__ import annotations

import logging
import signal
import sys
from typing import BinaryIO

from . import frames
from .guest_view import GuestSpec
from .native import EventKind, Guest, monotonic_deadline
from .template import Template

log = logging.getLogger(__name__)

EXIT_TIMEOUT = 124      # as timeout(1)
EXIT_SANDBOX_ERROR = 125


def run_to_completion(spec: GuestSpec, *, timeout: float | None = None, trace: bool = False,
                      stdout: BinaryIO | None = None, stderr: BinaryIO | None = None) -> int:
    """Boot spec in a fresh sandbox and run it; returns its exit status the way a shell reports
    it (128 + signal for a crash, 124 for a timeout, 125 when it broke a sandbox rule)."""
    err = stderr or sys.stderr.buffer
    with Guest.boot(spec, trace_fd=err.fileno() if trace else None) as guest:
        return _drive(guest, timeout, stdout or sys.stdout.buffer, err)


def run_from_template(template: Template, request: dict, *, extra_view: list[str] | None = None,
                      timeout: float | None = None, trace: bool = False,
                      stdout: BinaryIO | None = None, stderr: BinaryIO | None = None) -> int:
    """The fast path: fork the template (numpy & co already imported) and have its agent run
    the program as `python` would (a RUN frame: argv and one of code, module or path)."""
    err = stderr or sys.stderr.buffer
    with template.snapshot.fork() as guest:
        for path in extra_view or []:
            guest.view_add(path)
        if trace:
            guest.set_trace_fd(err.fileno())
        guest.push_input(frames.encode(frames.FrameType.RUN, request))
        return _drive(guest, timeout, stdout or sys.stdout.buffer, err)


def _drive(guest: Guest, timeout: float | None, out: BinaryIO, err: BinaryIO) -> int:
    deadline = monotonic_deadline(timeout)
    while True:
        ev = guest.run(deadline)
        if ev.kind is EventKind.OUTPUT:
            stream = out if ev.stream == 1 else err
            stream.write(ev.data)
            stream.flush()
        elif ev.kind is EventKind.EXIT:
            return ev.status
        elif ev.kind is EventKind.FAULT:
            err.write(f"zeroboot: {ev.message}\n".encode())
            return 128 + ev.signal
        elif ev.kind is EventKind.TIMEOUT:
            err.write(f"zeroboot: the guest was stopped after its {timeout:g} s timeout\n".encode())
            return EXIT_TIMEOUT
        elif ev.kind is EventKind.ERROR:
            err.write(f"zeroboot: {ev.message}\n".encode())
            return EXIT_SANDBOX_ERROR
        elif ev.kind is EventKind.INPUT:
            err.write(b"zeroboot: the guest waits for UART input, which `run` does not provide\n")
            return EXIT_SANDBOX_ERROR
        # KICK: a host signal arrived (Python raises KeyboardInterrupt here if it was SIGINT);
        # FRAME: UART frames mean nothing to `run`. Either way, keep going.


def interrupt_exit_code() -> int:
    return 128 + signal.SIGINT
