"""`python -m zeroboot_kernel.bench threads`: guest threads (issue 14), guest vs host in one run.

Thread create+join latency, a GIL ping-pong between two threads (switches/s), a
ThreadPoolExecutor.map of 1,000 small tasks, each timed inside the guest (a fork of the template)
and in this process on the host; and the `1+1` round trip of a fork with 4 idle background threads
alive against one without threads (median of many cells).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from ..template import Template
from .common import markdown_table, results_dir, write_results

# Each snippet prints one number: seconds for the whole measurement.
SNIPPETS = {
    "thread create+join (x200)": (
        "import threading, time\nt0 = time.perf_counter()\n"
        "for _ in range(200):\n    t = threading.Thread(target=int); t.start(); t.join()\n"
        "print(time.perf_counter() - t0)", 200),
    "GIL ping-pong (2,000 switches)": (
        "import threading, time\na, b = threading.Semaphore(0), threading.Semaphore(0)\nN = 1000\n"
        "def pong():\n    for _ in range(N):\n        a.acquire(); b.release()\n"
        "t = threading.Thread(target=pong); t.start()\nt0 = time.perf_counter()\n"
        "for _ in range(N):\n    a.release(); b.acquire()\n"
        "print(time.perf_counter() - t0); t.join()", 2000),
    "ThreadPoolExecutor.map, 1,000 tasks": (
        "import time\nfrom concurrent.futures import ThreadPoolExecutor\nt0 = time.perf_counter()\n"
        "with ThreadPoolExecutor(4) as ex:\n    s = sum(ex.map(abs, range(1000)))\n"
        "print(time.perf_counter() - t0)", 1000),
}
IDLE_THREADS = ("import threading\nidle_stop = threading.Event()\n"
                "idle = [threading.Thread(target=idle_stop.wait, daemon=True) for _ in range(4)]\n"
                "[t.start() for t in idle]")


def _host(code: str) -> float:
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "<bench>", "exec"), {})
    return float(buf.getvalue().split()[0])


def _round_trips(sb: Any, cells: int) -> float:
    samples = []
    for _ in range(cells):
        t0 = time.perf_counter()
        r = sb.execute("1+1")
        samples.append(time.perf_counter() - t0)
        assert r.status == "ok", r
    return statistics.median(samples) * 1e3


def measure(cells: int = 200) -> dict[str, Any]:
    template = Template.ensure()
    res: dict[str, Any] = {"rows": {}, "round_trip": {}}
    with template.fork() as sb:
        for label, (code, ops) in SNIPPETS.items():
            r = sb.execute(code)
            assert r.status == "ok", r
            guest_s, host_s = float(r.stdout.split()[0]), _host(code)
            res["rows"][label] = {"guest_us_per_op": round(guest_s / ops * 1e6, 1),
                                  "host_us_per_op": round(host_s / ops * 1e6, 1),
                                  "guest_per_s": round(ops / guest_s), "host_per_s": round(ops / host_s)}
    with template.fork() as plain, template.fork() as busy:
        assert busy.execute(IDLE_THREADS).status == "ok"
        res["round_trip"] = {"no threads ms": round(_round_trips(plain, cells), 3),
                             "4 idle threads ms": round(_round_trips(busy, cells), 3)}
    return res


def markdown(res: dict[str, Any]) -> str:
    rows = [[label, v["guest_us_per_op"], v["host_us_per_op"], v["guest_per_s"], v["host_per_s"]]
            for label, v in res["rows"].items()]
    table = markdown_table(["threads", "guest us/op", "host us/op", "guest ops/s", "host ops/s"], rows)
    rt = res["round_trip"]
    return table + "\n" + markdown_table(["`1+1` round trip (median)", "ms"], [[k, v] for k, v in rt.items()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench threads", description=__doc__)
    p.add_argument("--cells", type=int, default=200, help="1+1 cells per round-trip sample set")
    p.add_argument("--json", default=None, help="default: bench/results/threads.json")
    args = p.parse_args(argv)
    res = measure(args.cells)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "threads.json", "threads", res, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
