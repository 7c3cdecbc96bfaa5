"""Run a guest program to completion, streaming its output: the back end of `zeroboot-kernel run`."""
from __future__ import annotations

import logging
import signal
import sys
from typing import BinaryIO

from .native import EventKind, Guest, monotonic_deadline
from .guest_view import GuestSpec

log = logging.getLogger(__name__)

EXIT_TIMEOUT = 124      # as timeout(1)
EXIT_SANDBOX_ERROR = 125


def run_to_completion(spec: GuestSpec, *, timeout: float | None = None, trace: bool = False,
                      stdout: BinaryIO | None = None, stderr: BinaryIO | None = None) -> int:
    """Boot spec in a fresh sandbox and run it; returns its exit status the way a shell reports
    it (128 + signal for a crash, 124 for a timeout, 125 when it broke a sandbox rule)."""
    out = stdout or sys.stdout.buffer
    err = stderr or sys.stderr.buffer
    deadline = monotonic_deadline(timeout)
    with Guest.boot(spec, trace_fd=err.fileno() if trace else None) as sb:
        while True:
            ev = sb.run(deadline)
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
