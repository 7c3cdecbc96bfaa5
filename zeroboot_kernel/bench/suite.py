"""`python -m zeroboot_kernel.bench all`: every benchmark in one run, then the report.

Runs the sections one after another (engine, peers, kernel, scaling, files, syscalls, startup,
memory, batch), writes each
one's JSON (+ .md) into --out, a summary `all.json` with the headline numbers, and renders
docs/PERFORMANCE.md with its charts (docs/img/). `--quick` runs every section with few
repetitions (a smoke run of a few minutes; the CI smoke test uses it) and, unless --report is given, writes the
report next to the results instead of into docs/.
The soak (`bench soak`) is not part of it: it runs for an hour at full size.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

from . import batch, common, engine, files, kernel, memory, peers, report, scaling, startup, syscalls

log = logging.getLogger(__name__)


def sections(quick: bool) -> dict[str, Callable[[], dict[str, Any]]]:
    """section name -> how to measure it, at full or quick size."""
    if quick:  # CI's smoke run (tests/test_bench_quick.py): every path of every section, a few times each
        return {"engine": lambda: engine.measure(quick=True), "peers": lambda: peers.measure(runs=1),
                "kernel": lambda: kernel.measure(iterations=3, warmup=1), "scaling": lambda: scaling.measure(quick=True),
                "files": lambda: files.measure(size_mb=8),
                "syscalls": lambda: syscalls.measure(quick=True),
                "startup": lambda: startup.measure(runs=1, matmul_runs=1, matmul_loops=2),
                "memory": lambda: memory.measure(quick=True), "batch": lambda: batch.measure(quick=True)}
    return {"engine": engine.measure, "peers": peers.measure, "kernel": kernel.measure, "scaling": scaling.measure,
            "files": files.measure, "syscalls": syscalls.measure, "startup": startup.measure, "memory": memory.measure,
            "batch": batch.measure}


def run_all(out: Path, quick: bool, report_path: Path | None) -> dict[str, Any]:
    started = time.perf_counter()
    durations = {}
    for name, measure in sections(quick).items():
        log.info("bench all: %s", name)
        t = time.perf_counter()
        res = measure()
        durations[name] = round(time.perf_counter() - t, 1)
        common.write_results(out / f"{name}.json", name, res, report.SECTIONS[name].markdown(res))
    results = report.load(out)  # as written: dates and machine included
    summary: dict[str, Any] = {"quick": quick, "sections": list(durations), "section_seconds": durations,
               "seconds": round(time.perf_counter() - started, 1), "headline": report.headline(results)}
    common.write_results(out / "all.json", "all", summary, report.headline_markdown(summary["headline"]))
    command = "python -m zeroboot_kernel.bench all" + (" --quick" if quick else "")
    report.render(results, out, report_path or (out / "PERFORMANCE.md" if quick else report.default_report()), command)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench all", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few repetitions and small data, a few minutes")
    p.add_argument("--out", type=Path, default=common.results_dir(), help="where the JSON results go "
                   "(default bench/results/)")
    p.add_argument("--report", type=Path, default=None, help="the markdown report to write (default "
                   "docs/PERFORMANCE.md; with --quick, PERFORMANCE.md in --out)")
    args = p.parse_args(argv)
    logging.basicConfig(format="%(message)s")
    logging.getLogger(__package__).setLevel(logging.INFO)  # progress, also under the CLI's quieter root logger
    summary = run_all(args.out, args.quick, args.report)
    print(report.headline_markdown(summary["headline"]))
    print(f"done in {summary['seconds']:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
