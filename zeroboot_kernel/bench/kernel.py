"""`python -m zeroboot_kernel.bench.kernel`: execute round trips of the zeroboot kernel next to
stock ipykernel (`python3`), in one run.

A round trip is what a frontend waits for: from sending execute_request until it has both the
execute_reply (shell) and the idle status (IOPub) of that request. Cases:
  1+1      the smallest cell with a result
  print    a 10 KB print (stdout streamed back)
  matmul   a 512x512 float64 numpy matmul (BLAS single-threaded in both kernels, as in the guest)
  plot     a small matplotlib line plot through the inline backend (a PNG display_data)
The kernels alternate case by case, so drift hits both alike. The zeroboot kernel runs in chained
mode, where every cell also pays for its checkpoint. Results: p50/p99 per case and kernel, the
ratio zeroboot/python3, as a table and as JSON (with a markdown summary next to it). Also per
kernel: start to first reply, a Jupyter restart (new kernel process) to first reply and, for
zeroboot, `%sandbox reset` (a fresh fork of the template in the running kernel).
"""
from __future__ import annotations

import argparse
import atexit
import functools
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

from . import common, latency

RESTARTS = 3        # Jupyter restarts per kernel (the median is reported)
STOCK = "python3"
OURS = "zeroboot"
QUEUED = 30         # cells sent at once in the Run All case
QUEUED_REPEATS = 3
TRACED = "zeroboot (ZEROBOOT_TRACE=1)"  # a third kernel, for the latency breakdown (bench/latency.py)


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    setup: str = ""
    teardown: str = ""  # run after the case, so that the cases after it start as before


CASES = (
    Case("1+1", "1+1"),
    Case("print", "print('x' * 10_000)"),
    Case("matmul", "b = a @ a", "import numpy as np\na = np.random.default_rng(0).random((512, 512))"),
    Case("plot", "plt.plot([1, 3, 2]); plt.show()", "%matplotlib inline\nimport matplotlib.pyplot as plt"),
    # autoreload checks the mtime of every module's source before each cell (a stat each)
    Case("autoreload", "x = 1", "%load_ext autoreload\n%autoreload 2", "%autoreload 0"),
)


def _thread_env() -> dict[str, str]:
    from ..guest_view import THREAD_ENV

    return dict(THREAD_ENV)


def _ensure_our_kernelspec() -> str | None:
    """Install the zeroboot kernelspecs into a temporary prefix if Jupyter does not know them;
    returns that directory (added to JUPYTER_PATH) or None."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(OURS)
        return None
    except NoSuchKernel:
        pass
    from ..install import Destination, install_kernelspecs

    prefix = tempfile.mkdtemp(prefix="zeroboot-bench-kernelspec-")
    atexit.register(shutil.rmtree, prefix, True)
    install_kernelspecs(Destination(prefix=prefix))
    data = os.path.join(prefix, "share", "jupyter")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([data, *filter(None, [os.environ.get("JUPYTER_PATH")])])
    return prefix


@functools.lru_cache(maxsize=1)
def _kernel_dir() -> str:
    """The kernels' working directory: an empty folder of the bench's own. Kernels and engines
    start with `python -m`, which puts the working directory first on sys.path: started from a
    source checkout, a `--baseline` kernelspec whose PYTHONPATH names another build would import
    the checkout's package instead, and compare a build with itself."""
    folder = tempfile.mkdtemp(prefix="zeroboot-bench-kernels-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


class BenchKernel:
    """One kernel and a blocking client that measures round trips."""

    def __init__(self, name: str, timeout: float, env: dict[str, str] | None = None) -> None:
        from jupyter_client.manager import KernelManager

        self.name = name
        self.timeout = timeout
        self.km = KernelManager(kernel_name=name)
        self.last_stamps: dict[str, int] = {}  # the last round trip's (bench/latency.py)
        t0 = time.perf_counter()
        # Single-threaded BLAS for the stock kernel too: the guest has one vCPU, so its BLAS runs one thread.
        self.km.start_kernel(env={**os.environ, **_thread_env(), **(env or {})}, cwd=_kernel_dir())
        self.kc = self.km.client()
        self.kc.start_channels()
        self._until_first_reply()
        self.startup = time.perf_counter() - t0

    def _until_first_reply(self) -> None:
        self.kc.wait_for_ready(timeout=self.timeout)
        self.round_trip("1")  # the zeroboot engine starts in the background: be sure it is up

    def restart(self) -> float:
        """Seconds from a Jupyter restart (the kernel process is replaced) to the first reply."""
        t0 = time.perf_counter()
        self.km.restart_kernel(now=False)
        self._until_first_reply()
        return time.perf_counter() - t0

    def round_trip(self, code: str) -> float:
        """Seconds until both the reply and the idle status are in (blocking waits, no spinning:
        each returns as soon as its message is there, so the time is that of the later one)."""
        seen: dict[str, Any] = {}

        def idle(m: dict[str, Any]) -> bool:
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "busy":
                seen["busy"] = m["header"].get("date")
            return bool(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle")

        offset = latency.wall_offset_ns()
        c_send = time.monotonic_ns()
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=False)
        deadline = time.monotonic() + self.timeout
        reply = self._wait(self.kc.get_shell_msg, msg_id, deadline, lambda m: True)
        idle_msg = self._wait(self.kc.get_iopub_msg, msg_id, deadline, idle)
        elapsed = time.perf_counter() - t0
        c_idle = time.monotonic_ns()
        status = reply["content"]["status"]
        if status != "ok":
            raise RuntimeError(f"{self.name}: {code!r} failed ({status})")
        self.last_stamps = latency.stamps_of(c_send, c_idle, seen.get("busy"), reply, idle_msg["header"].get("date"),
                                             offset)
        return elapsed

    def queued(self, code: str, n: int) -> float:
        """Milliseconds per cell when n requests are sent at once (Run All): until the last idle.
        The zeroboot kernel's checkpoint after each reply is then on the path of the next cell."""
        t0 = time.perf_counter()
        left = {self.kc.execute(code, store_history=False) for _ in range(n)}
        deadline = time.monotonic() + self.timeout
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.name}: {len(left)} queued cells without idle within {self.timeout} s")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except Empty:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                left.discard(msg["parent_header"].get("msg_id"))
        while True:  # the replies too, so that the next measurement starts clean
            try:
                self.kc.get_shell_msg(timeout=0.2)
            except Empty:
                break
        return (time.perf_counter() - t0) * 1e3 / n

    def _wait(self, get: Any, msg_id: str, deadline: float, wanted: Any) -> dict[str, Any]:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.name}: no reply/idle within {self.timeout} s")
            try:
                msg = get(timeout=remaining)
            except Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id and wanted(msg):
                return msg

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def measure(iterations: int = 100, warmup: int = 5, kernel: str = OURS, stock: str = STOCK,
            timeout: float = 120.0, breakdown: bool = True, baseline: str | None = None) -> dict[str, Any]:
    """Measure every case on both kernels; returns the results (times in milliseconds). With
    `breakdown`, a third kernel, ours with ZEROBOOT_TRACE=1, runs interleaved with them, and
    the round trips of it and of the stock kernel are cut into phases (bench/latency.py).
    `baseline`: the kernelspec of another build of the zeroboot kernel (one with tracing, e.g. the
    commit before a change), run traced and interleaved too: its phases are the "before"."""
    _ensure_our_kernelspec()
    names = [kernel, stock]
    kernels = {name: BenchKernel(name, timeout) for name in names}
    if breakdown:
        kernels[TRACED] = BenchKernel(kernel, timeout, env={"ZEROBOOT_TRACE": "1"})
        if baseline:
            kernels[baseline] = BenchKernel(baseline, timeout, env={"ZEROBOOT_TRACE": "1"})
    try:
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in kernels}
        stamps: dict[str, dict[str, list[dict[str, int]]]] = {name: {} for name in kernels}
        for case in CASES:
            for k in kernels.values():
                if case.setup:
                    k.round_trip(case.setup)
                for _ in range(warmup):
                    k.round_trip(case.code)
            for _ in range(iterations):
                for name, k in kernels.items():  # interleaved
                    samples[name].setdefault(case.name, []).append(k.round_trip(case.code) * 1e3)
                    stamps[name].setdefault(case.name, []).append(k.last_stamps)
            for k in kernels.values():
                if case.teardown:
                    k.round_trip(case.teardown)
        queued: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(QUEUED_REPEATS):  # Run All: QUEUED cells sent at once, interleaved by batch
            for name in names:
                queued[name].append(kernels[name].queued("1+1", QUEUED))
        startup = {name: round(kernels[name].startup * 1e3, 1) for name in names}
        sandbox_reset = [kernels[kernel].round_trip("%sandbox reset") * 1e3 for _ in range(max(3, iterations // 10))]
        # a restart replaces the kernel process: a few of them, interleaved, and their median
        restarts: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(RESTARTS):
            for name in names:
                restarts[name].append(kernels[name].restart() * 1e3)
        restart = {name: round(common.percentile(xs, 50), 1) for name, xs in restarts.items()}
    finally:
        for k in kernels.values():
            k.close()
    results: dict[str, Any] = {"iterations": iterations, "warmup": warmup, "kernels": names,
                               "startup_ms": startup, "restart_ms": restart,
                               "sandbox_reset_p50_ms": round(common.percentile(sandbox_reset, 50), 3), "cases": {},
                               "queued_ms_per_cell": {name: round(common.percentile(xs, 50), 2)
                                                      for name, xs in queued.items()}}
    for case in CASES:
        row: dict[str, Any] = {"code": case.code}
        for name in names:
            xs = samples[name][case.name]
            row[name] = {"p50_ms": round(common.percentile(xs, 50), 3), "p99_ms": round(common.percentile(xs, 99), 3),
                         "min_ms": round(min(xs), 3), "n": len(xs)}
        row["ratio_p50"] = round(row[kernel]["p50_ms"] / row[stock]["p50_ms"], 2)
        row["ratio_p99"] = round(row[kernel]["p99_ms"] / row[stock]["p99_ms"], 2)
        for extra in [n for n in kernels if n not in names]:  # the traced kernels' round trips, same run
            xs = samples[extra][case.name]
            row[extra] = {"p50_ms": round(common.percentile(xs, 50), 3), "p99_ms": round(common.percentile(xs, 99), 3)}
        results["cases"][case.name] = row
    if breakdown:
        results["traced"] = TRACED
        results["breakdown"] = {
            "codes": {case.name: case.code for case in CASES},
            "cases": {case.name: {name: latency.summarize(stamps[name][case.name])
                                  for name in (TRACED, stock) + ((baseline,) if baseline else ())}
                      for case in CASES}}
        if baseline:
            results["baseline"] = baseline
    return results


def markdown(results: dict[str, Any]) -> str:
    ours, stock = results["kernels"]
    rows = [[name, r[ours]["p50_ms"], r[ours]["p99_ms"], r[stock]["p50_ms"], r[stock]["p99_ms"],
             f"{r['ratio_p50']}x", f"{r['ratio_p99']}x"] for name, r in results["cases"].items()]
    for label, key in (("kernel start (to first reply)", "startup_ms"), (f"Jupyter restart (to first reply, median of {RESTARTS})", "restart_ms")):
        rows.append([label, results[key][ours], "", results[key][stock], "",
                     f"{results[key][ours] / results[key][stock]:.2f}x", ""])
    rows.append(["`%sandbox reset` (fresh fork, same kernel process)", results["sandbox_reset_p50_ms"], "", "", "", "",
                 ""])
    if "queued_ms_per_cell" in results:
        q = results["queued_ms_per_cell"]
        rows.append([f"Run All: {QUEUED} `1+1` sent at once, ms per cell (median of {QUEUED_REPEATS})", q[ours], "",
                     q[stock], "", f"{q[ours] / q[stock]:.2f}x", ""])
    table = common.markdown_table(["case", f"{ours} p50 ms", f"{ours} p99 ms", f"{stock} p50 ms",
                                   f"{stock} p99 ms", "ratio p50", "ratio p99"], rows)
    text = (f"{table}\nExecute round trip = request -> reply + idle, {results['iterations']} interleaved runs per "
            f"case; {ours} in chained mode (every cell also has its checkpoint for `%rewind`, taken right "
            f"after the previous reply went out).\n")
    if "breakdown" in results:
        traced = results["traced"]
        costs = ", ".join(f"{name} {r[traced]['p50_ms']} ms" for name, r in results["cases"].items())
        text += (f"\n### Where the time of a round trip goes\n\nA third kernel, {traced}, ran interleaved with the "
                 f"two above (its p50 round trips: {costs}); its stamps and the stock kernel's message dates cut "
                 f"each round trip into phases (zeroboot_kernel/bench/latency.py). Waterfall bars start where the "
                 f"p50s of the phases before them end, so they show proportions, not one real cell.\n\n")
        text += latency.markdown(results["breakdown"], ours, stock, traced)
        if "baseline" in results:
            text += "\n" + latency.before_after(results["breakdown"], results["baseline"], traced, stock)
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench.kernel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--iterations", type=int, default=100, help="measured runs per case and kernel")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured runs per case first")
    p.add_argument("--kernel", default=OURS, help=f"the zeroboot kernelspec (default {OURS})")
    p.add_argument("--stock", default=STOCK, help=f"the kernelspec to compare with (default {STOCK})")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one kernel start or cell")
    p.add_argument("--no-breakdown", action="store_true",
                   help="skip the latency breakdown (a third, traced zeroboot kernel)")
    p.add_argument("--baseline", default=None,
                   help="the kernelspec of an older zeroboot build with tracing: its phases shown as 'before'")
    p.add_argument("--chart", type=Path, default=None,
                   help="also draw the breakdown's waterfall as a PNG there (e.g. docs/img/latency.png)")
    p.add_argument("--json", type=Path, default=common.results_dir() / "kernel.json",
                   help="where the results go (a .md summary is written next to it)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    results = measure(args.iterations, args.warmup, args.kernel, args.stock, args.timeout, not args.no_breakdown,
                      args.baseline)
    text = markdown(results)
    common.write_results(args.json, "kernel", results, text)
    if args.chart is not None and "breakdown" in results:
        latency.chart(results["breakdown"], results["kernels"][0], results["kernels"][1], results["traced"], args.chart)
    print(text)
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
