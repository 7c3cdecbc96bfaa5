"""`python -m zeroboot_kernel.bench soak --cells 10000`: one zeroboot kernel (chained mode) runs many
mixed cells through jupyter_client; memory and fds of the kernel and engine processes must stay flat.

The cells come from a fixed cycle (deterministic): prints (small, ~10 KB, stderr), numpy arrays
created and overwritten (up to 16 MB), a cell that raises, a segfault and an abort (SandboxCrashed,
rolled back), a cell that runs past `%sandbox timeout 1` (SandboxTimeout, rolled back), `%rewind`
and `%rewind 2`, HTML and matplotlib displays, `%sandbox stats|checkpoints`, and cells that sleep or print
while 1-10 interrupts come at random (seeded) moments, before, during and right after them, as
the stop button sends them (KernelManager.interrupt_kernel): such a cell ends ok or with
KeyboardInterrupt (never a rollback), prints a prefix of its output, and the next cell is not hit.

Every cell's outcome is checked: status, ename, the error message on IOPub, the printed text or the
result. A counter in the sandbox follows a model kept here (incremented by cells, kept by an
ordinary exception, undone by a rollback or %rewind) and is read back several times per cycle.

Every K cells a sample: RSS and fd count of the kernel and engine processes, cells done, elapsed
time, p50 round trip of the cells since the previous sample; also the engine's memfds (one per
snapshot store) and, from a `%sandbox stats` run between two cells (not counted as a cell; it takes
no checkpoint), the guest's own memory and the kept checkpoints' size: these tell the guest's
growth from the engine's. The report has the samples, the
failures, cells/s, and the growth per 1000 cells between the sample after the warm-up (the first
cells legitimately grow memory while the 20 kept checkpoints fill up) and the end. The exit status
is non-zero if any cell failed. tests/test_soak_short.py runs 500 cells.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import re
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import common
from .kernel import OURS, BenchKernel, _ensure_our_kernelspec

log = logging.getLogger(__name__)

KEEP = 20                  # checkpoints the kernel keeps by default (ZEROBOOT_CHECKPOINTS)
SANDBOX_TIMEOUT = 1        # seconds, for the cell that loops forever
MAX_WARMUP = 200           # growth is measured from min(10% of the cells, this) on
MAX_FAILURES_KEPT = 200    # in the report; the count is always exact
ENGINE_ARGV = b"zeroboot_kernel.engine_server"


# ---- the cells and what they should do ----------------------------------------------------------

@dataclass(frozen=True)
class Expect:
    status: str = "ok"
    ename: str | None = None
    result: str | None = None           # text/plain of the execute_result
    stdout: str | None = None           # all of stdout, exactly
    stderr: str | None = None
    stdout_contains: str | None = None
    mime: str | None = None             # a display_data or execute_result carrying this type
    interruptible: bool = False         # interrupted: ok, or KeyboardInterrupt (never a rollback)
    stdout_prefix_of: str | None = None  # all of stdout is a prefix of this (complete lines)


@dataclass(frozen=True)
class Cell:
    kind: str
    code: str
    expect: Expect
    delta: int = 0              # what the cell adds to the counter (if it is not rolled back)
    rolled_back: bool = False   # crash / timeout: the engine restores the cell's checkpoint
    rewind: int = 0             # %rewind N
    magic_only: bool = False    # no guest code: no checkpoint is taken
    interrupts: tuple[float, ...] = ()  # seconds after the request: an interrupt each


class Model:
    """What the sandbox's counter should be, and the counter at each checkpoint the engine keeps
    (taken before every cell that runs guest code; a rollback drops its own, %rewind N pops N)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.counter = 0
        self.keep = keep
        self.checkpoints: list[int] = []

    def apply(self, cell: Cell) -> None:
        if cell.rewind:
            for _ in range(cell.rewind):
                self.counter = self.checkpoints.pop()
            return
        if cell.magic_only:
            return
        self.checkpoints.append(self.counter)
        del self.checkpoints[:-self.keep]
        if cell.rolled_back:
            self.checkpoints.pop()
        else:
            self.counter += cell.delta


def _incr(r: int, m: Model) -> Cell:
    return Cell("incr", "counter += 1", Expect(), delta=1)


def _incr_then_rewind(r: int, m: Model) -> Cell:
    return Cell("incr", "counter += 10", Expect(), delta=10)


def _read(r: int, m: Model) -> Cell:
    return Cell("read", "counter", Expect(result=str(m.counter)))


def _print(r: int, m: Model) -> Cell:
    return Cell("print", "print(f'soak {counter}')", Expect(stdout=f"soak {m.counter}\n"))


def _print_10k(r: int, m: Model) -> Cell:
    n = 10_000 + r % 7
    return Cell("print_10k", f"print('x' * {n})", Expect(stdout="x" * n + "\n"))


def _stderr(r: int, m: Model) -> Cell:
    return Cell("stderr", f"import sys\nprint('soak err {r}', file=sys.stderr)", Expect(stderr=f"soak err {r}\n"))


def _numpy(r: int, m: Model) -> Cell:
    # eight arrays of changing sizes, each overwritten every eighth cycle
    slot, n = r % 8, 64 * (1 + (r * 3) % 8)
    code = f"import numpy as np\narr_{slot} = np.full(({n}, {n}), counter, dtype=np.int64)\nint(arr_{slot}.sum())"
    return Cell("numpy", code, Expect(result=str(n * n * m.counter)))


def _numpy_big(r: int, m: Model) -> Cell:
    # 16 MB rewritten every cycle: the checkpoint after it copies them
    code = "import numpy as np\nbig = np.zeros(2_000_000)\nbig[::1000] = counter\nint(big.sum())"
    return Cell("numpy_16mb", code, Expect(result=str(2000 * m.counter)))


def _dict(r: int, m: Model) -> Cell:
    return Cell("dict", "junk = {j: str(j) * 3 for j in range(20_000)}\nlen(junk)", Expect(result="20000"))


def _raise(r: int, m: Model) -> Cell:
    # an ordinary exception keeps the cell's side effects, as in ipykernel
    ename, stmt = [("ValueError", "raise ValueError(f'soak {counter}')"), ("ZeroDivisionError", "1 / 0"),
                   ("KeyError", "{}['soak']")][r % 3]
    return Cell("raise", f"counter += 1\n{stmt}", Expect(status="error", ename=ename), delta=1)


def _segfault(r: int, m: Model) -> Cell:
    return Cell("segfault", "counter += 100\nimport ctypes\nctypes.string_at(0)",
                Expect(status="error", ename="SandboxCrashed"), delta=100, rolled_back=True)


def _abort(r: int, m: Model) -> Cell:
    return Cell("abort", "counter += 100\nimport os\nos.abort()",
                Expect(status="error", ename="SandboxCrashed"), delta=100, rolled_back=True)


def _timeout_on(r: int, m: Model) -> Cell:
    return Cell("magic", f"%sandbox timeout {SANDBOX_TIMEOUT}",
                Expect(stdout_contains=f"cell timeout: {SANDBOX_TIMEOUT} s"), magic_only=True)


def _loop_forever(r: int, m: Model) -> Cell:
    return Cell("timeout", "counter += 1000\nwhile True: pass",
                Expect(status="error", ename="SandboxTimeout"), delta=1000, rolled_back=True)


def _timeout_off(r: int, m: Model) -> Cell:
    return Cell("magic", "%sandbox timeout 0", Expect(stdout_contains="cell timeout: none"), magic_only=True)


def _rewind(r: int, m: Model) -> Cell:
    n = 1 + r % 2
    return Cell("rewind", "%rewind" if n == 1 else f"%rewind {n}",
                Expect(stdout_contains=f"rewound {n} cell(s)"), rewind=n, magic_only=True)


def _html(r: int, m: Model) -> Cell:
    return Cell("html", f"from IPython.display import HTML, display\ndisplay(HTML('<b>soak {r}</b>'))",
                Expect(mime="text/html"))


def _repr_html(r: int, m: Model) -> Cell:
    code = "class SoakRepr:\n    def _repr_html_(self):\n        return '<i>soak</i>'\nSoakRepr()"
    return Cell("repr_html", code, Expect(mime="text/html"))


def _plot(r: int, m: Model) -> Cell:
    code = (f"import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(3, 2))\n"
            f"ax.plot([1, {r % 5 + 2}, 2])\nplt.show()")
    return Cell("plot", code, Expect(mime="image/png"))


def _interrupt_times(r: int, salt: int) -> tuple[float, ...]:
    """1-10 interrupts at seeded random moments: before the cell's code (0), while it runs
    (the cells below run ~0.4 s), and right after it."""
    rng = random.Random(r * 1009 + salt)
    return tuple(sorted(rng.choice([0.0, rng.uniform(0, 0.4), rng.uniform(0.4, 0.6)])
                        for _ in range(rng.randint(1, 10))))


def _interrupted_sleep(r: int, m: Model) -> Cell:
    return Cell("interrupted_sleep", "import time\nfor _ in range(40): time.sleep(0.01)",
                Expect(stdout="", interruptible=True), interrupts=_interrupt_times(r, 1))


def _interrupted_print(r: int, m: Model) -> Cell:
    lines = "".join(f"soak line {j}\n" for j in range(40))
    return Cell("interrupted_print", "import time\nfor j in range(40):\n    print(f'soak line {j}')\n"
                "    time.sleep(0.01)", Expect(stdout_prefix_of=lines, interruptible=True),
                interrupts=_interrupt_times(r, 2))


def _sandbox_info(r: int, m: Model) -> Cell:
    if r % 2:
        return Cell("magic", "%sandbox checkpoints", Expect(stdout_contains="checkpoint(s)"), magic_only=True)
    return Cell("magic", "%sandbox stats", Expect(stdout_contains="chained"), magic_only=True)


# One cycle; cell i of the soak is CYCLE[i % len(CYCLE)](i // len(CYCLE), model).
CYCLE: tuple[Callable[[int, Model], Cell], ...] = (
    _incr, _print, _numpy, _print_10k, _raise, _html, _read, _segfault, _read,
    _incr_then_rewind, _rewind, _read, _timeout_on, _loop_forever, _timeout_off, _read,
    _numpy_big, _plot, _repr_html, _abort, _dict, _stderr, _sandbox_info, _print,
    _interrupted_sleep, _read, _interrupted_print, _read,
)


def cell_at(i: int, model: Model) -> Cell:
    return CYCLE[i % len(CYCLE)](i // len(CYCLE), model)


# ---- running one cell -------------------------------------------------------------------------

@dataclass
class Outcome:
    reply: dict[str, Any]
    msgs: list[dict[str, Any]]     # IOPub messages of the request, busy to idle
    seconds: float


class SoakKernel(BenchKernel):
    """BenchKernel (start, readiness, waits by msg_id) plus a round trip that keeps every message."""

    def execute(self, code: str, interrupts: tuple[float, ...] = ()) -> Outcome:
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=True)  # as a notebook does
        firing = None
        if interrupts:
            firing = threading.Thread(target=self._interrupt_at, args=(time.monotonic(), interrupts), daemon=True)
            firing.start()
        deadline = time.monotonic() + self.timeout
        reply = self._wait(self.kc.get_shell_msg, msg_id, deadline, lambda m: True)["content"]
        msgs: list[dict[str, Any]] = []

        def keep_until_idle(m: dict[str, Any]) -> bool:
            msgs.append(m)
            return m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"

        self._wait(self.kc.get_iopub_msg, msg_id, deadline, keep_until_idle)
        seconds = time.perf_counter() - t0
        if firing is not None:
            # the interrupts sent after the reply must be handled before the next cell starts
            # (the kernel drops them: no cell runs), or they would stop that cell
            firing.join()
            self._barrier(deadline)
        return Outcome(reply, msgs, seconds)

    def _interrupt_at(self, t0: float, times: tuple[float, ...]) -> None:
        for at in times:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            self.km.interrupt_kernel()

    def _barrier(self, deadline: float) -> None:
        """A kernel_info round trip: the kernel handled the SIGINTs sent before it."""
        msg_id = self.kc.kernel_info()
        self._wait(self.kc.get_shell_msg, msg_id, deadline, lambda m: True)

    @property
    def pid(self) -> int:
        return int(self.km.provisioner.process.pid)  # type: ignore[union-attr]


def _streams(msgs: list[dict[str, Any]], name: str) -> str:
    return "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream" and m["content"]["name"] == name)


def _result(msgs: list[dict[str, Any]]) -> str | None:
    return next((str(m["content"]["data"].get("text/plain")) for m in msgs if m["msg_type"] == "execute_result"), None)


def check(cell: Cell, out: Outcome) -> str | None:
    """What is wrong with the outcome of cell (None if it is what the cell should do)."""
    e, reply, msgs = cell.expect, out.reply, out.msgs
    problems = []
    if e.interruptible and reply.get("ename") == "KeyboardInterrupt":
        e = Expect(status="error", ename="KeyboardInterrupt", stdout_prefix_of=e.stdout_prefix_of or "")
    elif e.stdout_prefix_of is not None:  # it ran to its end: all of its output
        e = Expect(stdout=e.stdout_prefix_of)
    if reply.get("status") != e.status:
        problems.append(f"status {reply.get('status')} ({reply.get('ename')}: {str(reply.get('evalue'))[:200]})")
    elif e.ename and reply.get("ename") != e.ename:
        problems.append(f"ename {reply.get('ename')} ({str(reply.get('evalue'))[:200]})")
    errors = [m["content"].get("ename") for m in msgs if m["msg_type"] == "error"]
    expected_errors = [e.ename] if e.status == "error" else []
    if errors != expected_errors:
        problems.append(f"error messages on IOPub {errors}")
    stdout, stderr, result = _streams(msgs, "stdout"), _streams(msgs, "stderr"), _result(msgs)
    if e.stdout is not None and stdout != e.stdout:
        problems.append(f"stdout {stdout[:80]!r} ({len(stdout)} chars)")
    if e.stderr is not None and stderr != e.stderr:
        problems.append(f"stderr {stderr[:80]!r}")
    if e.stdout_prefix_of is not None and not e.stdout_prefix_of.startswith(stdout):
        problems.append(f"stdout is not a prefix of the cell's output: ...{stdout[-80:]!r}")
    if e.stdout_contains is not None and e.stdout_contains not in stdout:
        problems.append(f"stdout {stdout[:200]!r}")
    if e.result is not None and result != e.result:
        problems.append(f"result {result!r}")
    if e.mime is not None and not any(e.mime in (m["content"].get("data") or {}) for m in msgs
                                      if m["msg_type"] in ("display_data", "execute_result")):
        problems.append(f"no {e.mime} output (got {[m['msg_type'] for m in msgs]})")
    return "; ".join(problems) or None


def _expected_text(e: Expect) -> str:
    return ", ".join(f"{k}={v if len(str(v)) < 80 else str(v)[:60] + '...'!r}"
                     for k, v in asdict(e).items() if v is not None)


# ---- processes ----------------------------------------------------------------------------------

def _status_kib(pid: int) -> dict[str, int]:
    fields = {"VmRSS": "rss_kib", "RssAnon": "anon_kib", "RssFile": "file_kib", "RssShmem": "shmem_kib",
              "Threads": "threads"}
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in fields:
                out[fields[key]] = int(value.split()[0])
    return out


def process_usage(pid: int) -> dict[str, int]:
    """RSS (and its parts, KiB), threads, open fds, and the memfds among them (the engine keeps
    each snapshot store in one: their number and allocated KiB) of a live process."""
    fds = os.listdir(f"/proc/{pid}/fd")
    memfds, memfd_kib = 0, 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                memfds += 1
                memfd_kib += os.stat(f"/proc/{pid}/fd/{fd}").st_blocks // 2
        except OSError:
            continue  # closed meanwhile
    return {**_status_kib(pid), "fds": len(fds), "memfds": memfds, "memfd_kib": memfd_kib}


def engine_pids(kernel_pid: int) -> list[int]:
    """The engine processes of a kernel: its children running engine_server (not zombies)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if int(ppid) == kernel_pid and state != "Z" and ENGINE_ARGV in argv:
            pids.append(int(entry))
    return sorted(pids)


def _sum_usage(usages: list[dict[str, int]]) -> dict[str, int]:
    keys = ("rss_kib", "anon_kib", "file_kib", "shmem_kib", "threads", "fds", "memfds", "memfd_kib")
    return {k: sum(u.get(k, 0) for u in usages) for k in keys}


def take_sample(kernel_pid: int, cells: int, elapsed: float, trips: list[float], failures: int) -> dict[str, Any]:
    engines = engine_pids(kernel_pid)
    return {
        "cells": cells,
        "elapsed_s": round(elapsed, 2),
        "p50_ms": round(common.percentile(trips, 50) * 1e3, 2) if trips else None,
        "failures": failures,
        "kernel": process_usage(kernel_pid),
        "engine": _sum_usage([process_usage(pid) for pid in engines]),
        "engine_pids": engines,
    }


STATS_FIELDS = {  # line of `%sandbox stats` -> (sample key, pattern of the value)
    "memory of the live fork": ("guest_mib", r"([\d.]+) MiB of"),
    "checkpoints kept": ("checkpoint_mib", r"\(([\d.]+) MiB private\)"),
    "cells run in the sandbox": ("cells_run", r"(\d+)"),
    "rollbacks (crash/timeout/interrupt)": ("rollbacks", r"(\d+)"),
}


def parse_stats(text: str) -> dict[str, float | None]:
    """The numbers of `%sandbox stats` that tell the guest's own growth (its heap, the kept
    checkpoints) from the engine's; None where the text did not say."""
    out: dict[str, float | None] = {key: None for key, _ in STATS_FIELDS.values()}
    for line in text.splitlines():
        for label, (key, pattern) in STATS_FIELDS.items():
            if line.startswith(label) and (m := re.search(pattern, line[len(label):])):
                out[key] = float(m.group(1))
    return out


# ---- the soak ---------------------------------------------------------------------------------

@dataclass
class Run:
    cells: int
    sample_every: int
    kernel: SoakKernel
    model: Model = field(default_factory=Model)
    samples: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    failure_count: int = 0
    trips_by_kind: dict[str, list[float]] = field(default_factory=dict)
    aborted: str | None = None

    def fail(self, index: int, cell: Cell | None, expected: str, got: str) -> None:
        self.failure_count += 1
        log.warning("soak: cell %d (%s) failed: expected %s; got %s", index, cell.kind if cell else "-", expected, got)
        if len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append({"cell": index, "kind": cell.kind if cell else None,
                                  "code": cell.code if cell else None, "expected": expected, "got": got})


def default_sample_every(cells: int) -> int:
    """About 100 samples, always at the same point of the cycle (a whole number of cycles apart),
    so that samples compare like with like."""
    return len(CYCLE) * max(1, round(cells / 100 / len(CYCLE)))


def warmup_cells(cells: int) -> int:
    """10% of the cells, but at least the cells it takes the KEEP kept checkpoints (and the
    snapshot stores that hold them) to fill up: rollbacks and rewinds pop checkpoints, and magic
    cells take none, so that is about three times KEEP cells of the cycle."""
    return min(MAX_WARMUP, max(cells // 10, 3 * KEEP))


def _run_one(run: Run, i: int) -> float | None:
    """Run cell i and check it; returns its round trip (s), or None if the soak cannot go on."""
    cell = cell_at(i, run.model)
    try:
        out = run.kernel.execute(cell.code, cell.interrupts)
    except TimeoutError as exc:
        alive = run.kernel.km.is_alive()
        run.fail(i, cell, _expected_text(cell.expect), f"{exc} (kernel {'alive' if alive else 'dead'})")
        run.aborted = f"cell {i}: {exc}"
        return None
    run.trips_by_kind.setdefault(cell.kind, []).append(out.seconds)
    problem = check(cell, out)
    if problem:
        run.fail(i, cell, _expected_text(cell.expect), problem)
    run.model.apply(cell)
    value = _result(out.msgs)
    if problem and cell.kind == "read" and value is not None and value.lstrip("-").isdigit():
        run.model.counter = int(value)  # follow the kernel from here on: one bug, one failure
    return out.seconds


def _sample(run: Run, done: int, t0: float, trips: list[float]) -> None:
    s = take_sample(run.kernel.pid, done, time.perf_counter() - t0, trips, run.failure_count)
    # not one of the soak's cells: a magic-only cell takes no checkpoint and changes no state
    try:
        s["sandbox"] = parse_stats(_streams(run.kernel.execute("%sandbox stats").msgs, "stdout"))
    except TimeoutError as exc:
        log.warning("soak: no %%sandbox stats: %s", exc)
        s["sandbox"] = parse_stats("")
    run.samples.append(s)
    if len(s["engine_pids"]) != 1:
        run.fail(done, None, "one engine process", f"engine processes {s['engine_pids']}")
    log.info("soak: %d/%d cells, %.0f s, p50 %s ms | kernel %.1f MiB %d fds | engine %.1f MiB %d fds "
             "(guest %s MiB, checkpoints %s MiB) | %d failures",
             done, run.cells, s["elapsed_s"], s["p50_ms"], s["kernel"]["rss_kib"] / 1024, s["kernel"]["fds"],
             s["engine"]["rss_kib"] / 1024, s["engine"]["fds"], s["sandbox"]["guest_mib"],
             s["sandbox"]["checkpoint_mib"], run.failure_count)


def _loop(run: Run) -> tuple[int, float]:
    """Run the cells, sampling every sample_every cells; returns (cells done, seconds)."""
    t0 = time.perf_counter()
    trips: list[float] = []  # round trips since the previous sample
    _sample(run, 0, t0, trips)
    done = 0
    try:
        for i in range(run.cells):
            seconds = _run_one(run, i)
            if seconds is None:
                break
            done = i + 1
            trips.append(seconds)
            if done % run.sample_every == 0 and done != run.cells:
                _sample(run, done, t0, trips)
                trips = []
    except KeyboardInterrupt:  # a long soak stopped by hand still reports what it saw
        run.aborted = f"interrupted by the user after {done} cells"
    elapsed = time.perf_counter() - t0
    if run.kernel.km.is_alive():
        _sample(run, done, t0, trips)
    else:
        run.fail(done, None, "a live kernel", "the kernel process exited")
        run.aborted = run.aborted or f"the kernel died after {done} cells"
    return done, elapsed


def growth(samples: list[dict[str, Any]], warmup: int) -> dict[str, Any] | None:
    """Change of RSS (KiB) and fds between the first sample after the warm-up and the last one,
    in total and per 1000 cells; also the least-squares slope over all samples after the warm-up
    (per 1000 cells), which one noisy end point cannot skew. None without two such samples."""
    after = [s for s in samples if s["cells"] >= warmup]
    if len(after) < 2 or after[-1]["cells"] <= after[0]["cells"]:
        return None
    start, end = after[0], after[-1]
    per_1000 = 1000 / (end["cells"] - start["cells"])
    out: dict[str, Any] = {"from_cells": start["cells"], "to_cells": end["cells"]}
    for proc in ("kernel", "engine"):
        for key in ("rss_kib", "fds", "memfds"):
            change = end[proc][key] - start[proc][key]
            out[f"{proc}_{key}_change"] = change
            out[f"{proc}_{key}_per_1000_cells"] = round(change * per_1000, 1)
            fit = statistics.linear_regression([s["cells"] for s in after], [s[proc][key] for s in after])
            out[f"{proc}_{key}_slope_per_1000_cells"] = round(fit.slope * 1000, 1)
    return out


def _report(run: Run, done: int, elapsed: float) -> dict[str, Any]:
    warmup = warmup_cells(run.cells)
    return {
        "cells": run.cells,
        "cells_done": done,
        "kernel_name": run.kernel.name,
        "cycle": [f(0, Model()).kind for f in CYCLE],
        "sample_every": run.sample_every,
        "warmup_cells": warmup,
        "duration_s": round(elapsed, 2),
        "cells_per_s": round(done / elapsed, 2) if elapsed > 0 else None,
        "failure_count": run.failure_count,
        "failures": run.failures,
        "aborted": run.aborted,
        "growth": growth(run.samples, warmup),
        "round_trip_ms": {kind: {k: round(v * 1e3, 2) if k != "n" else v for k, v in common.summarize(xs).items()}
                          for kind, xs in sorted(run.trips_by_kind.items())},
        "samples": run.samples,
    }


def run_soak(cells: int, *, sample_every: int | None = None, timeout: float = 60.0,
             kernel_name: str = OURS) -> dict[str, Any]:
    """Run `cells` cells of the cycle in one new kernel; returns the report (see module doc)."""
    if cells < 1:
        raise ValueError("cells must be >= 1")
    _ensure_our_kernelspec()
    kernel = SoakKernel(kernel_name, timeout)
    try:
        run = Run(cells, sample_every or default_sample_every(cells), kernel)
        setup = Cell("setup", "counter = 0", Expect())
        problem = check(setup, kernel.execute(setup.code))
        if problem:
            raise RuntimeError(f"the soak's first cell failed: {problem}")
        run.model.apply(setup)
        done, elapsed = _loop(run)
    finally:
        kernel.close()
    return _report(run, done, elapsed)


# ---- output -------------------------------------------------------------------------------------

def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def _per_1000(g: dict[str, Any] | None, key: str, unit: str) -> str:
    if g is None:
        return "-"
    return f"{g[key] / 1024:+.2f} MiB" if unit == "rss_kib" else f"{g[key]:+.1f}"


def markdown(results: dict[str, Any], chart: str | None = None) -> str:
    samples, g = results["samples"], results["growth"]
    first, last = samples[0], samples[-1]
    warm = next((s for s in samples if s["cells"] >= results["warmup_cells"]), last)
    head = common.markdown_table(
        ["cells", "failures", "duration", "cells/s"],
        [[f"{results['cells_done']} of {results['cells']}", results["failure_count"],
          f"{results['duration_s']:.0f} s", results["cells_per_s"]]])
    rows = []
    for label, proc, key in (("kernel RSS (MiB)", "kernel", "rss_kib"), ("engine RSS (MiB)", "engine", "rss_kib"),
                             ("kernel fds", "kernel", "fds"), ("engine fds", "engine", "fds"),
                             ("engine snapshot stores (memfds)", "engine", "memfds")):
        fmt = _mib if key == "rss_kib" else str
        rows.append([label, fmt(first[proc][key]), fmt(warm[proc][key]), fmt(last[proc][key]),
                     _per_1000(g, f"{proc}_{key}_per_1000_cells", key),
                     _per_1000(g, f"{proc}_{key}_slope_per_1000_cells", key)])
    table = common.markdown_table(
        ["", "start (0 cells)", f"after warm-up ({warm['cells']} cells)", f"end ({last['cells']} cells)",
         "growth per 1000 cells", "fitted slope per 1000 cells"], rows)
    text = (f"# Soak: {results['cells']} mixed cells in one zeroboot kernel (chained mode)\n\n{head}\n{table}\n"
            f"Cycle of {len(results['cycle'])} cells: {', '.join(results['cycle'])}.\n")
    if results["aborted"]:
        text += f"\n**Stopped early:** {results['aborted']}\n"
    for f in results["failures"][:10]:
        text += f"\n- cell {f['cell']} ({f['kind']}): expected {f['expected']}; got {f['got']}"
    if results["failures"]:
        text += "\n"
    if chart:
        text += f"\n![RSS and fds over cells]({chart})\n"
    return text


def write_chart(results: dict[str, Any], path: Path) -> bool:
    """A PNG of RSS and fds of both processes over cells; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("soak: matplotlib is not installed; no chart")
        return False
    xs = [s["cells"] for s in results["samples"]]
    fig, (rss, fds) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    for proc in ("kernel", "engine"):
        rss.plot(xs, [s[proc]["rss_kib"] / 1024 for s in results["samples"]], label=proc)
        fds.plot(xs, [s[proc]["fds"] for s in results["samples"]], label=proc)
    rss.set_ylabel("RSS (MiB)")
    fds.set_ylabel("open fds")
    fds.set_xlabel("cells")
    rss.set_ylim(bottom=0)
    fds.set_ylim(bottom=0)
    rss.legend()
    rss.set_title(f"zeroboot kernel soak: {results['cells_done']} cells, {results['failure_count']} failures")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", type=int, default=10_000, help="cells to run (default 10000)")
    p.add_argument("--sample-every", type=int, default=None,
                   help=f"cells between samples (default: about 100 samples, a multiple of the "
                        f"{len(CYCLE)}-cell cycle)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one cell's reply and idle status")
    p.add_argument("--kernel", default=OURS, help=f"the kernelspec (default {OURS})")
    p.add_argument("--out", type=Path, default=common.results_dir() / "soak.json",
                   help="where the results go (a .md summary is written next to it)")
    p.add_argument("--chart", type=Path, default=None, help="also draw RSS and fds over cells into this PNG "
                   "(e.g. docs/img/soak.png)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    results = run_soak(args.cells, sample_every=args.sample_every, timeout=args.timeout, kernel_name=args.kernel)
    chart = None
    if args.chart and write_chart(results, args.chart):
        chart = os.path.relpath(args.chart.resolve(), args.out.resolve().parent)
    text = markdown(results, chart)
    common.write_results(args.out, "soak", results, text)
    print(text)
    print(f"results: {args.out}")
    return 1 if results["failure_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
