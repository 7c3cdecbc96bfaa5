"""`python -m zeroboot_kernel.bench scaling`: how forks behave as more of them are alive, and how
many isolated cells per second one and two workers get through.

Fork latency and memory: with N live forks (each has run one cell, so it holds its own dirty
pages), the p50/p99 of forking more (each closed at once), and the host memory each live fork
costs: USS and PSS of this process (the engine runs in it) divided by N, and the drop of the
host's MemAvailable divided by N (which also counts KVM's page tables and shadow pages).

Throughput: worker processes, each with its own engine, run isolated cells (restore the template
in place + execute, what the kernel does per isolated cell) for a fixed time; cells/s with 1 worker
and with 2 at once (this machine has 2 cores).
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..template import Template
from . import common

CELL = "sum(i * i for i in range(1000))"
PROBE_FORKS = 50


def fork_scaling(template: Template, populations: tuple[int, ...]) -> list[dict[str, Any]]:
    rows = []
    live: list[Any] = []
    with template.fork() as warm:  # one-time costs (the template mapping, engine tables) go in the baseline
        warm.execute("print(1)")
    template.snapshot.engine.release_parked()  # memory per new fork: none starts on the warm one's memory
    gc.collect()
    before = common.memory_sample()
    try:
        for n in populations:
            while len(live) < n:
                sb = template.fork()
                sb.execute("print(1)")
                live.append(sb)
            per_fork = common.per_fork_kb(before, common.memory_sample(), n)
            times = []
            for _ in range(PROBE_FORKS):
                t = time.perf_counter()
                probe = template.fork()
                times.append((time.perf_counter() - t) * 1e3)
                probe.close()
            rows.append({"live_forks": n, "fork_p50_ms": common.percentile(times, 50),
                         "fork_p99_ms": common.percentile(times, 99),
                         "uss_kb_per_fork": per_fork["uss"], "pss_kb_per_fork": per_fork["pss"],
                         "host_kb_per_fork": per_fork["host"]})
    finally:
        for sb in live:
            sb.close()
    return rows


def worker(seconds: float) -> int:
    """Run isolated cells for `seconds` after a warm-up; print how many finished."""
    template = Template.ensure()
    sb = template.fork()
    for _ in range(3):
        sb.execute(CELL)
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        sb.restore(template.snapshot, fresh=True)
        if sb.execute(CELL).status != "ok":
            raise RuntimeError(f"worker: {CELL!r} failed")
        done += 1
    sb.close()
    print(json.dumps({"cells": done, "seconds": seconds}))
    return 0


def throughput(workers: int, seconds: float) -> float:
    """Cells per second of `workers` worker processes running at the same time."""
    cmd = [sys.executable, "-m", "zeroboot_kernel.bench.scaling", "--worker", str(seconds)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    total = 0.0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 300)
        if proc.returncode != 0:
            raise RuntimeError(f"throughput worker exited {proc.returncode}")
        r = json.loads(out.strip().splitlines()[-1])
        total += r["cells"] / r["seconds"]
    return round(total, 1)


def measure(quick: bool = False) -> dict[str, Any]:
    template = Template.ensure()
    populations = (1, 10) if quick else (1, 10, 100, 1000)  # --quick: CI's smoke run, the paths not the curve
    seconds = 1.0 if quick else 10.0
    one, two = throughput(1, seconds), throughput(2, seconds)
    return {"quick": quick, "cell": CELL, "probe_forks": PROBE_FORKS, "forks": fork_scaling(template, populations),
            "throughput_seconds": seconds, "cells_per_s_1_worker": one, "cells_per_s_2_workers": two,
            "speedup_2_workers": round(two / one, 2)}


def markdown(res: dict[str, Any]) -> str:
    rows = [[r["live_forks"], r["fork_p50_ms"], r["fork_p99_ms"], r["uss_kb_per_fork"], r["pss_kb_per_fork"],
             r["host_kb_per_fork"]] for r in res["forks"]]
    table = common.markdown_table(["live forks", "fork p50 ms", "fork p99 ms", "USS KiB/fork", "PSS KiB/fork",
                                   "host KiB/fork (MemAvailable)"], rows)
    return (table + "\nEach live fork has run `print(1)`. With one live fork, the template pages it has read "
            "count as its own in USS until a second fork maps them too; PSS shares them out. What stays per fork "
            "is the pages its cell wrote: CPython's reference counts and specializing interpreter write to "
            "the objects and code a cell runs through, about 1,000 pages for IPython's run_cell.\n"
            f"\nIsolated cells (`{res['cell']}`, restore + execute) per second: "
            f"{res['cells_per_s_1_worker']} with 1 worker, {res['cells_per_s_2_workers']} with 2 "
            f"({res['speedup_2_workers']}x).\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="up to 10 live forks, 1 s of throughput (a smoke run)")
    p.add_argument("--json", type=Path, default=common.results_dir() / "scaling.json")
    p.add_argument("--worker", type=float, metavar="SECONDS", help=argparse.SUPPRESS)  # one throughput worker
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    res = measure(args.quick)
    text = markdown(res)
    common.write_results(args.json, "scaling", res, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
