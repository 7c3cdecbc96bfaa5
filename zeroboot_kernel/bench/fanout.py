"""`python -m zeroboot_kernel.bench fanout`: a 50-value sweep of a ~10 ms cell.

`%%fanout i in range(50)` (fanout.run in a Session of this process: one fork of the live state per
value) against a Python loop of the same body in one cell of the same session (same run). Papermill
with 50 parameter sets is not measured here (50 kernel starts).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .. import fanout
from ..session import Session
from ..template import Template
from .common import markdown_table, results_dir, write_results

BODY = "import time\nt_end = time.perf_counter() + 0.01\nwhile time.perf_counter() < t_end: pass\ni * 2"


def measure(values: int = 50) -> dict[str, Any]:
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
    return {"values": values, "rows": {"%%fanout (one fork per value)": round(fan_s, 3),
                                       "Python loop in one cell": round(loop_s, 3)}}


def markdown(res: dict[str, Any]) -> str:
    return markdown_table([f"{res['values']}-value sweep of a 10 ms cell", "seconds"],
                          [[k, v] for k, v in res["rows"].items()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench fanout", description=__doc__)
    p.add_argument("--values", type=int, default=50)
    p.add_argument("--json", default=None, help="default: bench/results/fanout.json")
    args = p.parse_args(argv)
    res = measure(args.values)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "fanout.json", "fanout", res, table)
    print(table)
    return 0
