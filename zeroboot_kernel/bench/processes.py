"""`python -m zeroboot_kernel.bench processes`: guest processes (issue 15), guest vs host in one run.

os.fork() + os.waitpid() of the Python process: the guest's (the agent's CPython in a fork of the
template, where a fork is a copy-on-write sandbox fork run on the same executor VM) against a
fresh host CPython's (a subprocess of this one, so no engine or VM is in the forked process),
each timed inside its own process; a fork + pipe round trip (the child writes 1 byte, the
parent reads it and waits); and multiprocessing.Pool(2).map of 100 small tasks with the fork start
method (pool start, the map, close + join: its locks are semaphores in shared memory, woken across
processes), fewer iterations of it (POOL_ITERATIONS).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..template import Template
from .common import markdown_table, results_dir, write_results

# Each snippet prints the per-iteration times in seconds, one line.
SNIPPETS = {
    "os.fork + os.waitpid": (
        "import os, time\nts = []\n"
        "for _ in range({n}):\n"
        "    t0 = time.perf_counter(); pid = os.fork()\n"
        "    if pid == 0: os._exit(0)\n"
        "    os.waitpid(pid, 0); ts.append(time.perf_counter() - t0)\n"
        "print(*ts)"),
    "fork + 1-byte pipe + wait": (
        "import os, time\nts = []\n"
        "for _ in range({n}):\n"
        "    r, w = os.pipe(); t0 = time.perf_counter(); pid = os.fork()\n"
        "    if pid == 0: os.write(w, b'x'); os._exit(0)\n"
        "    os.read(r, 1); os.waitpid(pid, 0); ts.append(time.perf_counter() - t0); os.close(r); os.close(w)\n"
        "print(*ts)"),
    "multiprocessing.Pool(2).map, 100 tasks": (
        "import multiprocessing as mp, time\nts = []\n"
        "for _ in range({n}):\n"
        "    t0 = time.perf_counter()\n"
        "    with mp.get_context('fork').Pool(2) as p:\n"
        "        assert p.map(abs, range(-100, 0)) == list(range(100, 0, -1))\n"
        "        p.close(); p.join()\n"
        "    ts.append(time.perf_counter() - t0)\n"
        "print(*ts)"),
}
# A pool's start, map and join is a whole sequence of forks and hand-overs: fewer of them.
POOL_ITERATIONS = 5


def _times(text: str) -> list[float]:
    return [float(x) for x in text.split()]


def measure(n: int = 20) -> dict[str, Any]:
    template = Template.ensure()
    res: dict[str, Any] = {"iterations": n, "rows": {}}
    with template.fork() as sb:
        for label, code in SNIPPETS.items():
            src = code.format(n=min(n, POOL_ITERATIONS) if "Pool" in label else n)
            r = sb.execute(src)
            assert r.status == "ok", r
            guest = _times(r.stdout)
            host = _times(subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                                         check=True).stdout)
            res["rows"][label] = {"guest_ms_median": round(statistics.median(guest) * 1e3, 2),
                                  "guest_ms_min": round(min(guest) * 1e3, 2),
                                  "host_ms_median": round(statistics.median(host) * 1e3, 2),
                                  "host_ms_min": round(min(host) * 1e3, 2)}
    return res


def markdown(res: dict[str, Any]) -> str:
    rows = [[label, v["guest_ms_median"], v["guest_ms_min"], v["host_ms_median"], v["host_ms_min"],
             round(v["guest_ms_median"] / v["host_ms_median"], 1) if v["host_ms_median"] else "-"]
            for label, v in res["rows"].items()]
    return markdown_table([f"processes (x{res['iterations']})", "guest ms (median)", "guest ms (min)",
                           "host ms (median)", "host ms (min)", "guest / host"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench processes", description=__doc__)
    p.add_argument("--iterations", type=int, default=20, help="forks per measurement")
    p.add_argument("--json", default=None, help="default: bench/results/processes.json")
    args = p.parse_args(argv)
    res = measure(args.iterations)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "processes.json", "processes", res, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
