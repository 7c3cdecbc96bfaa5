"""`python -m zeroboot_kernel.bench load`: K zeroboot kernels running small cells at the same
time (a class pressing Shift-Enter together) next to K stock ipykernels under the same load.

Each kernel has its own client thread that runs CELLS (a mix of small cells) back to back; all
K clients of one kind start together at a barrier. The kinds alternate round by round (ours,
stock, ours, stock, ...), so drift and the other jobs of the host hit both alike. Per kind:
round-trip p50/p99 (request -> reply + idle), the wall time of a round (throughput), failures,
and per cell the host CPU time and the context switches of the kernels' process trees (each
kernel process with its children, the zeroboot engine; every thread counted):
voluntary switches are waits a thread blocked in and was woken from (wake-ups), nonvoluntary
ones are preemptions (a thread that wanted to run waited for a time slice). Read from
/proc/<pid>/task/<tid>/status (voluntary_ctxt_switches, nonvoluntary_ctxt_switches) and
/proc/<pid>/task/<tid>/stat (utime + stime) before and after each round. The CPU time of the
kernels' child processes (the zeroboot engines, with the guests they run) is also given apart.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import common
from .kernel import OURS, STOCK, BenchKernel, _ensure_our_kernelspec

CELLS = ("1+1", "x = sum(range(1000))", "print('hello')", "len(str(list(range(100))))", "y = [i * i for i in range(200)]")
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """pid and its descendants (the zeroboot kernel's engine process)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _counters(pids: list[int]) -> dict[str, int]:
    """Summed over every thread of these processes: voluntary/nonvoluntary switches, CPU ticks."""
    total = {"voluntary": 0, "nonvoluntary": 0, "cpu_ticks": 0}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            total["voluntary"] += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            total["nonvoluntary"] += int(line.split()[1])
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total["cpu_ticks"] += int(fields[11]) + int(fields[12])  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
    return total


def _kernel_pid(k: BenchKernel) -> int:
    pid = getattr(getattr(k.km, "provisioner", None), "pid", None) or getattr(k.km.provisioner, "process").pid
    return int(pid)


def _round(kernels: list[BenchKernel], cells: int) -> dict[str, Any]:
    """All kernels run `cells` cells each at once; round trips (ms), wall s, failures, counters."""
    barrier = threading.Barrier(len(kernels) + 1)
    times: list[list[float]] = [[] for _ in kernels]
    failures = [0] * len(kernels)

    def client(i: int) -> None:
        k = kernels[i]
        barrier.wait()
        for n in range(cells):
            try:
                times[i].append(k.round_trip(CELLS[n % len(CELLS)]) * 1e3)
            except Exception:  # noqa: BLE001 - counted, the round goes on
                failures[i] += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(kernels))]
    for t in threads:
        t.start()
    roots = [_kernel_pid(k) for k in kernels]
    pids = [p for root in roots for p in _tree(root)]
    below = [p for p in pids if p not in roots]  # the zeroboot engines (stock ipykernel: none)
    before, before_below = _counters(pids), _counters(below)
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after, after_below = _counters(pids), _counters(below)
    return {"times": [x for xs in times for x in xs], "wall_s": wall, "failures": sum(failures),
            **{k: after[k] - before[k] for k in before},
            "child_cpu_ticks": after_below["cpu_ticks"] - before_below["cpu_ticks"]}


def measure(kernels: int = 10, cells: int = 60, rounds: int = 2, timeout: float = 300.0,
            baseline: str | None = None) -> dict[str, Any]:
    """K kernels of each kind; `rounds` rounds per kind, alternating; returns the results.
    `baseline`: the kernelspec of another zeroboot build, run as a third kind (its "before")."""
    _ensure_our_kernelspec()
    names = [OURS, STOCK] + ([baseline] if baseline else [])
    started = {name: [BenchKernel(name, timeout) for _ in range(kernels)] for name in names}
    try:
        for ks in started.values():  # warm: every kernel has run each cell once
            for k in ks:
                for code in CELLS:
                    k.round_trip(code)
        per: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for _ in range(rounds):
            for name in names:
                per[name].append(_round(started[name], cells))
    finally:
        for ks in started.values():
            for k in ks:
                try:
                    k.close()
                except Exception:  # noqa: BLE001 - closing the rest matters more
                    pass
    res: dict[str, Any] = {"kernels": kernels, "cells": cells, "rounds": rounds, "codes": list(CELLS), "kinds": names}
    for name, rs in per.items():
        xs = [x for r in rs for x in r["times"]]
        n = max(1, len(xs))
        res[name] = {
            "p50_ms": round(common.percentile(xs, 50), 2), "p99_ms": round(common.percentile(xs, 99), 2),
            "wall_s": round(sum(r["wall_s"] for r in rs) / len(rs), 3),
            "cells_per_s": round(len(xs) / sum(r["wall_s"] for r in rs), 1),
            "failures": sum(r["failures"] for r in rs),
            "cpu_ms_per_cell": round(sum(r["cpu_ticks"] for r in rs) * 1e3 / CLOCK_TICK / n, 2),
            "child_cpu_ms_per_cell": round(sum(r["child_cpu_ticks"] for r in rs) * 1e3 / CLOCK_TICK / n, 2),
            "voluntary_per_cell": round(sum(r["voluntary"] for r in rs) / n, 1),
            "nonvoluntary_per_cell": round(sum(r["nonvoluntary"] for r in rs) / n, 1),
        }
    o, s = res[OURS], res[STOCK]
    res["ratio_p50"] = round(o["p50_ms"] / s["p50_ms"], 2)
    res["ratio_p99"] = round(o["p99_ms"] / s["p99_ms"], 2)
    res["ratio_wall"] = round(o["wall_s"] / s["wall_s"], 2)
    return res


def markdown(res: dict[str, Any]) -> str:
    ours, stock = res["kinds"][:2]
    extra = res["kinds"][2:]
    rows = []
    for label, key in (("round trip p50 ms", "p50_ms"), ("round trip p99 ms", "p99_ms"),
                       ("wall time of a round s", "wall_s"), ("cells/s (all kernels)", "cells_per_s"),
                       ("failures", "failures"), ("host CPU ms per cell (kernel + engine)", "cpu_ms_per_cell"),
                       ("of it: the kernel's child processes (the zeroboot engine)", "child_cpu_ms_per_cell"),
                       ("voluntary context switches (wake-ups) per cell", "voluntary_per_cell"),
                       ("nonvoluntary context switches (preemptions) per cell", "nonvoluntary_per_cell")):
        a, b = res[ours][key], res[stock][key]
        rows.append([label, a, b, f"{a / b:.2f}x" if b else ""] + [res[e][key] for e in extra])
    table = common.markdown_table(["under load", ours, stock, "ratio"] + [f"before: {e}" for e in extra], rows)
    return (f"{table}\n{res['kernels']} kernels of each kind, each running {res['cells']} small cells back to back at "
            f"the same time ({', '.join(f'`{c}`' for c in res['codes'])}), {res['rounds']} rounds per kind, "
            f"alternating. Context switches and CPU: every thread of each kernel's process tree "
            f"(/proc/<pid>/task/<tid>/status and stat).\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", "--kernels", type=int, default=10, help="kernels of each kind running at once")
    p.add_argument("-n", "--cells", type=int, default=60, help="cells per kernel per round")
    p.add_argument("--rounds", type=int, default=2, help="rounds per kind (alternating)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one kernel start or cell")
    p.add_argument("--baseline", default=None, help="the kernelspec of an older zeroboot build, run as a third kind")
    p.add_argument("--json", type=Path, default=common.results_dir() / "load.json",
                   help="where the results go (a .md summary is written next to it)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    res = measure(args.kernels, args.cells, args.rounds, args.timeout, args.baseline)
    text = markdown(res)
    common.write_results(args.json, "load", res, text)
    print(text)
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
