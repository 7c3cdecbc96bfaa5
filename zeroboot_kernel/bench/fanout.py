"""`python -m zeroboot_kernel.bench fanout`: a 50-value sweep of a ~10 ms cell.

`%%fanout i in range(50)` (fanout.run in a Session of this process: one fork of the live state per
value) against a Python loop of the same body in one cell of the same session, and against
papermill running a notebook of that body with 50 parameter sets (`-p i VALUE`, the stock `python3`
kernel, one after another as the fan-out's forks run: each run starts a kernel and re-runs the
notebook's cells), in the same run. And `--jobs`: the same sweep through an engine process as the
kernel runs it, with --jobs 1 (the runs one after another in that engine) and --jobs 2 (two worker
engines that resume a save of the values' fork: fanout_jobs.py; their start is counted), side by
side. --quick: 5 values.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from nbformat import v4

from .. import engine_requests as req
from .. import fanout
from .. import fanout_jobs
from ..engine_client import EngineClient
from ..session import Session
from ..template import Template
from .common import markdown_table, results_dir, time_command, write_results

def body(cell_ms: float = 10) -> str:
    """The swept cell: busy for cell_ms milliseconds, then i * 2."""
    return f"import time\nt_end = time.perf_counter() + {cell_ms / 1000!r}\nwhile time.perf_counter() < t_end: pass\ni * 2"


BODY = body()


def papermill_sweep(values: int) -> float:
    """Seconds for `values` papermill runs of the body, one parameter set each; every output checked."""
    with tempfile.TemporaryDirectory(prefix="zeroboot-bench-fanout-") as d:
        params = v4.new_code_cell("i = 0")
        params.metadata["tags"] = ["parameters"]
        nb = v4.new_notebook(cells=[v4.new_code_cell("x = 1"), params, v4.new_code_cell(BODY)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        src = Path(d) / "sweep.ipynb"
        nbformat.write(nb, str(src))
        papermill = str(Path(sys.executable).with_name("papermill"))
        t = time.perf_counter()
        for i in range(values):
            time_command([papermill, str(src), str(Path(d) / f"out{i}.ipynb"), "-p", "i", str(i), "-k", "python3",
                          "--no-progress-bar"], timeout=600)
        seconds = time.perf_counter() - t
        for i in range(values):
            out = nbformat.read(str(Path(d) / f"out{i}.ipynb"), as_version=4)
            result = out.cells[-1].outputs[0]["data"]["text/plain"]
            if result != str(i * 2):
                raise RuntimeError(f"bench fanout: papermill run {i} gave {result!r}, not {i * 2}")
        return seconds


def jobs_sweep(values: int, jobs: int, cell: str = BODY) -> float:
    """Seconds for the sweep through an engine process (a new one, started before the clock), as
    the kernel runs `%%fanout i in range(values) --jobs N`; every result checked."""
    with tempfile.TemporaryDirectory(prefix="zeroboot-bench-fanout-") as d:
        def start() -> EngineClient:
            return EngineClient(project=d)
        client = start()
        try:
            client.call(req.EXECUTE, code="x = 1", execution_count=1)
            code = f"%%fanout i in range({values}) --jobs {jobs}\n{cell}"
            t = time.perf_counter()
            if jobs == 1:
                events = list(client.request(req.EXECUTE, code=code, execution_count=2))
            else:
                events = list(fanout_jobs.FanoutJobs(client, start).run(code, 2, jobs))
            seconds = time.perf_counter() - t
            if events[-1]["content"].get("status") != "ok":
                raise RuntimeError(f"bench fanout: --jobs {jobs} failed: {events[-1]['content']}")
            got = client.call(req.EXECUTE, code="None", execution_count=3, user_expressions={"r": "str(_fanout)"})
            text = got["user_expressions"]["r"]["data"]["text/plain"]
            if text != repr(str([i * 2 for i in range(values)])):
                raise RuntimeError(f"bench fanout: --jobs {jobs} gave _fanout {text[:200]}")
        finally:
            client.close()
    return seconds


def measure(values: int = 50, papermill: bool = True, jobs: bool = True, cell_ms: float = 10) -> dict[str, Any]:
    s = Session(Template.ensure())
    try:
        s.execute("x = 1", execution_count=1)
        t = time.perf_counter()
        reply = fanout.run(s, f"%%fanout i in range({values})\n{BODY}", execution_count=2, on_stream=None,
                           on_message=None)
        fan_s = time.perf_counter() - t
        assert reply["status"] == "ok", reply
        loop = "results = []\nfor i in range(%d):\n" % values + "".join(
            f"    {line}\n" for line in BODY.splitlines()[:-1]) + "    results.append(i * 2)\n"
        t = time.perf_counter()
        reply = s.execute(loop, execution_count=3)
        loop_s = time.perf_counter() - t
        assert reply["status"] == "ok", reply
    finally:
        s.close()
    rows = {"%%fanout (one fork per value)": round(fan_s, 3), "Python loop in one cell": round(loop_s, 3)}
    if jobs:
        one, two = jobs_sweep(values, 1, body(cell_ms)), jobs_sweep(values, 2, body(cell_ms))
        rows[f"%%fanout --jobs 1 (kernel's engine process; {cell_ms:g} ms cell)"] = round(one, 3)
        rows[f"%%fanout --jobs 2 (two worker engines, their start included; {cell_ms:g} ms cell)"] = round(two, 3)
        rows["--jobs 2 / --jobs 1 (time ratio)"] = round(two / one, 2)
    if papermill:
        rows[f"papermill, {values} parameter sets (stock python3 kernel, one after another)"] = \
            round(papermill_sweep(values), 3)
    return {"values": values, "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    return markdown_table([f"{res['values']}-value sweep of a 10 ms cell (unless a row says)", "seconds"],
                          [[k, v] for k, v in res["rows"].items()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench fanout", description=__doc__)
    p.add_argument("--values", type=int, default=None, help="default 50, --quick 5")
    p.add_argument("--quick", action="store_true", help="5 values")
    p.add_argument("--no-papermill", action="store_true", help="leave out the papermill row")
    p.add_argument("--cell-ms", type=float, default=10, help="the --jobs rows' cell: busy this long (default 10)")
    p.add_argument("--no-jobs", action="store_true", help="leave out the --jobs 1 / --jobs 2 rows")
    p.add_argument("--json", default=None, help="default: bench/results/fanout.json")
    args = p.parse_args(argv)
    res = measure(args.values or (5 if args.quick else 50), papermill=not args.no_papermill, jobs=not args.no_jobs,
                  cell_ms=args.cell_ms)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "fanout.json", "fanout", res, table)
    print(table)
    return 0
