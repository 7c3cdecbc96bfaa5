"""`python -m zeroboot_kernel.bench fanout`: a 50-value sweep of a ~10 ms cell.

`%%fanout i in range(50)` (fanout.run in a Session of this process: one fork of the live state per
value) against a Python loop of the same body in one cell of the same session, and against
papermill running a notebook of that body with 50 parameter sets (`-p i VALUE`, the stock `python3`
kernel, one after another as the fan-out's forks run: each run starts a kernel and re-runs the
notebook's cells), in the same run. --quick: 5 values.
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

from .. import fanout
from ..session import Session
from ..template import Template
from .common import markdown_table, results_dir, time_command, write_results

BODY = "import time\nt_end = time.perf_counter() + 0.01\nwhile time.perf_counter() < t_end: pass\ni * 2"


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


def measure(values: int = 50, papermill: bool = True) -> dict[str, Any]:
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
    if papermill:
        rows[f"papermill, {values} parameter sets (stock python3 kernel, one after another)"] = \
            round(papermill_sweep(values), 3)
    return {"values": values, "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    return markdown_table([f"{res['values']}-value sweep of a 10 ms cell", "seconds"],
                          [[k, v] for k, v in res["rows"].items()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench fanout", description=__doc__)
    p.add_argument("--values", type=int, default=None, help="default 50, --quick 5")
    p.add_argument("--quick", action="store_true", help="5 values")
    p.add_argument("--no-papermill", action="store_true", help="leave out the papermill row")
    p.add_argument("--json", default=None, help="default: bench/results/fanout.json")
    args = p.parse_args(argv)
    res = measure(args.values or (5 if args.quick else 50), papermill=not args.no_papermill)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "fanout.json", "fanout", res, table)
    print(table)
    return 0
