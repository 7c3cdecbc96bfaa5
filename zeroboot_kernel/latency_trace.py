"""Per-cell latency stamps (issue 20): where the milliseconds of a cell's round trip go.

Switched on by ZEROBOOT_TRACE=1 in the kernel's environment (the kernelspec's env, or the
environment Jupyter starts the kernel in; the engine process inherits it). The variable is read
once, when this module is imported, so with tracing off a cell pays one branch per stamp and
nothing else: no clock reads, no extra fields on the wire.

With tracing on, every execute request collects CLOCK_MONOTONIC stamps (time.monotonic_ns) in
three processes, all on the one host clock:
  kernel  k_enter (do_execute starts), k_worker (the worker thread runs _run_cell),
          k_sent (the request is on the engine channel), k_reply_in (its reply was read),
          k_back (do_execute continues on the shell loop after the thread hop back)
  engine  e_recv (the request was read), e_push (the EXECUTE frame goes to the guest),
          e_done (the DONE frame arrived), e_settled (the agent waits for the next request),
          e_reply (the reply is encoded), and the previous cell's checkpoint, taken after its
          reply (e_ckpt_start, e_ckpt_end); exits/syscalls/run_ns: the guest's counters over the cell
  guest   g_read (the agent has the request), g_run_start / g_run_end (IPython's run_cell),
          g_done (the DONE frame is about to be written)
The guest's clock is the vDSO's CLOCK_MONOTONIC, computed from the TSC and a data page the engine
rewrites with the host's CLOCK_MONOTONIC whenever the sandbox starts running (native/vdso_page.c),
so guest stamps are host time; the bench checks that they fall between e_push and e_done.

The kernel adds the stamps to the execute_reply's metadata as `zeroboot_trace`; `bench kernel`
turns them into phases next to stock ipykernel's (python -m zeroboot_kernel.bench kernel --trace).
Guest stamps are guest output: the engine takes them only as GUEST_STAMPS integers in range.
"""
from __future__ import annotations

import os
import time
from typing import Any

ENABLED: bool = os.environ.get("ZEROBOOT_TRACE", "") == "1"

now = time.monotonic_ns

GUEST_STAMPS = ("g_read", "g_run_start", "g_run_end", "g_done")
ENGINE_STAMPS = ("e_recv", "e_push", "e_done", "e_settled", "e_reply", "e_ckpt_start", "e_ckpt_end")
ENGINE_COUNTERS = ("exits", "syscalls", "run_ns")
KERNEL_STAMPS = ("k_enter", "k_worker", "k_sent", "k_reply_in", "k_back")
ALL_FIELDS = GUEST_STAMPS + ENGINE_STAMPS + ENGINE_COUNTERS + KERNEL_STAMPS
_MAX_NS = 1 << 63


def _ns(value: Any) -> int | None:
    """A stamp or counter: an int (not a bool) in [0, 2**63), else None."""
    if type(value) is int and 0 <= value < _MAX_NS:
        return value
    return None


def guest_stamps(value: Any) -> dict[str, int]:
    """The agent's stamps from a DONE payload (hostile: user code can write frames), as a dict of
    the GUEST_STAMPS that are well-formed; {} for anything that is not a list of that length."""
    if not isinstance(value, list) or len(value) != len(GUEST_STAMPS):
        return {}
    out: dict[str, int] = {}
    for name, raw in zip(GUEST_STAMPS, value):
        ns = _ns(raw)
        if ns is not None:
            out[name] = ns
    return out


def checked(value: Any) -> dict[str, int]:
    """A trace from the engine, checked: only ALL_FIELDS, only stamps in range."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, int] = {}
    for name in ALL_FIELDS:
        ns = _ns(value.get(name))
        if ns is not None:
            out[name] = ns
    return out
