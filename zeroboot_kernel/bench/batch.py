"""`python -m zeroboot_kernel.bench batch`: many small notebooks, `zeroboot-kernel execute --jobs 2`
vs the same through a local Dask cluster of 2 worker processes (`--dask --jobs 2`, the overhead of
going through Dask: cluster start, plugin setup, one task per notebook) vs papermill (stock python3
kernel, two at a time) vs `jupyter nbconvert --execute` (two processes), in the same run.

Each notebook (N = 200, --quick 2) has a papermill `parameters` cell (rows, and its own seed),
builds a numpy array and a pandas DataFrame, prints a describe() and draws one matplotlib plot
(a PNG output). zeroboot runs them all with one command (`-p rows R`); papermill runs one command
per notebook (`papermill IN OUT -p rows R -k python3`, as a pipeline does), two at a time; nbconvert
runs two commands, each with half of the notebooks (it starts a kernel per notebook; it cannot
inject parameters, so its notebooks run with their defaults, which are the same values). Wall time
includes each tool's own start-up. The template is built before the clock starts (a warm cache: the
state of every machine after `zeroboot-kernel install`), in a cache of the benchmark's own, so that
nobody else's `template rm` or rebuild lands inside the measurement (--quick, a smoke run: the
caller's cache). Every written notebook is checked: all cells run, one PNG, the printed row count
right; a run whose notebooks are wrong is an error.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nbformat
from nbformat import v4

from ..template import Template, cache_root
from . import common

JOBS = 2
QUICK_NOTEBOOKS = 2  # --quick (CI's smoke run): one per job
ROWS = 500
CELLS = [
    "import numpy as np\nimport pandas as pd\nimport matplotlib.pyplot as plt",
    "rng = np.random.default_rng(seed)\nx = rng.normal(size=rows)\ndf = pd.DataFrame({'x': x, 'y': x.cumsum()})",
    "print('rows', len(df))\ndf.describe()",
    "fig, ax = plt.subplots(figsize=(4, 3))\nax.plot(df['y'])\nax.set_title(f'seed {seed}')\nplt.show()",
]


def make_notebooks(folder: Path, n: int) -> list[Path]:
    paths = []
    for i in range(n):
        params = v4.new_code_cell(f"rows = {ROWS}\nseed = {i}")
        params.metadata["tags"] = ["parameters"]
        nb = v4.new_notebook(cells=[v4.new_markdown_cell(f"# Notebook {i}"), params, *map(v4.new_code_cell, CELLS)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        path = folder / f"nb{i:04d}.ipynb"
        nbformat.write(nb, str(path))
        paths.append(path)
    return paths


def check_outputs(folder: Path, names: list[str], tool: str) -> None:
    """Every notebook ran to the end: one PNG, the row count printed (a fast wrong run is no result)."""
    for name in names:
        nb = nbformat.read(str(folder / name), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        outputs = [o for c in code for o in c.outputs]
        pngs = [o for o in outputs if "image/png" in o.get("data", {})]
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        if any(c.execution_count is None for c in code) or len(pngs) != 1 or f"rows {ROWS}" not in text:
            raise RuntimeError(f"bench batch: {tool} wrote {folder / name} without all of its outputs")


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def run_zeroboot(paths: list[Path], out: Path, cache: Path) -> float:
    cmd = [sys.executable, "-m", "zeroboot_kernel", "execute", *map(str, paths), "--output-dir", str(out),
           "--jobs", str(JOBS), "-p", "rows", str(ROWS)]
    seconds, proc = common.time_command(cmd, timeout=3600, env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    if "building it now" in proc.stderr:
        raise RuntimeError("bench batch: the template was rebuilt inside the measurement")
    return seconds


def run_zeroboot_dask(paths: list[Path], out: Path, cache: Path) -> float:
    cmd = [sys.executable, "-m", "zeroboot_kernel", "execute", *map(str, paths), "--output-dir", str(out),
           "--dask", "--jobs", str(JOBS), "-p", "rows", str(ROWS)]
    seconds, proc = common.time_command(cmd, timeout=3600, env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    if "building it now" in proc.stderr:
        raise RuntimeError("bench batch: the template was rebuilt inside the measurement")
    return seconds


def _have_distributed() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def warm_cache(cache: Path) -> None:
    """Build the default template into `cache` (this process's environment is left as it was)."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        Template.ensure()
    finally:
        if saved is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = saved


def run_papermill(paths: list[Path], out: Path, cache: Path) -> float:
    def one(path: Path) -> None:
        common.time_command([_bin("papermill"), str(path), str(out / path.name), "-p", "rows", str(ROWS),
                             "-k", "python3", "--no-progress-bar"], timeout=600)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(JOBS) as pool:
        list(pool.map(one, paths))
    return time.perf_counter() - t0


def run_nbconvert(paths: list[Path], out: Path, cache: Path) -> float:
    halves = [paths[i::JOBS] for i in range(JOBS)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([_bin("jupyter"), "nbconvert", "--to", "notebook", "--execute",
                               "--ExecutePreprocessor.kernel_name=python3", "--output-dir", str(out), *map(str, half)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for half in halves if half]
    for p in procs:
        _, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"jupyter nbconvert exited {p.returncode}:\n{err[-2000:]}")
    return time.perf_counter() - t0


def measure(quick: bool = False, n: int | None = None) -> dict[str, Any]:
    n = n or (QUICK_NOTEBOOKS if quick else 200)
    root = Path(tempfile.mkdtemp(prefix="zeroboot-bench-batch-"))
    try:
        # --quick (a smoke run, no statistics) uses this process's cache, warm from the sections
        # before it, instead of building a template of its own (~10 s)
        cache = cache_root().parent.parent if quick else root / "cache"
        warm_cache(cache)  # as after `zeroboot-kernel install`
        src = root / "src"
        src.mkdir()
        paths = make_notebooks(src, n)
        names = [p.name for p in paths]
        tools: dict[str, Any] = {}
        runs = [("zeroboot", run_zeroboot), ("papermill", run_papermill), ("nbconvert", run_nbconvert)]
        if _have_distributed():
            runs.insert(1, ("zeroboot_dask", run_zeroboot_dask))
        for tool, run in runs:
            out = root / tool
            out.mkdir()
            seconds = run(paths, out, cache)
            check_outputs(out, names, tool)
            tools[tool] = {"seconds": round(seconds, 2), "notebooks_per_s": round(n / seconds, 2)}
        base = tools["zeroboot"]["notebooks_per_s"]
        for tool in ("papermill", "nbconvert", "zeroboot_dask"):
            if tool in tools:
                tools[tool]["zeroboot_speedup"] = round(base / tools[tool]["notebooks_per_s"], 1)
        return {"quick": quick, "notebooks": n, "jobs": JOBS, "rows": ROWS, "cells": CELLS, "tools": tools}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def markdown(res: dict[str, Any]) -> str:
    t = res["tools"]
    rows = [["`zeroboot-kernel execute --jobs 2`", t["zeroboot"]["seconds"], t["zeroboot"]["notebooks_per_s"], "1x"]]
    if "zeroboot_dask" in t:
        rows.append(["`zeroboot-kernel execute --dask --jobs 2` (LocalCluster, 2 worker processes)",
                     t["zeroboot_dask"]["seconds"], t["zeroboot_dask"]["notebooks_per_s"],
                     f"{t['zeroboot_dask']['zeroboot_speedup']}x"])
    rows += [["papermill, stock `python3` kernel, 2 at a time", t["papermill"]["seconds"],
             t["papermill"]["notebooks_per_s"], f"{t['papermill']['zeroboot_speedup']}x"],
            ["`jupyter nbconvert --execute`, 2 processes", t["nbconvert"]["seconds"],
             t["nbconvert"]["notebooks_per_s"], f"{t['nbconvert']['zeroboot_speedup']}x"]]
    table = common.markdown_table(["tool", "wall s", "notebooks/s", "zeroboot is faster by"], rows)
    return (f"{res['notebooks']} parameterised notebooks (numpy array and pandas DataFrame of {res['rows']} rows, "
            f"a describe(), one matplotlib PNG), run by each tool with {res['jobs']} at a time, in the same run; wall "
            "time includes each tool's start-up, the template was built before (a warm cache).\n\n" + table +
            "\nzeroboot forks each notebook's sandbox from the warm template in its worker engine; papermill and "
            "nbconvert start a kernel process per notebook and import numpy, pandas and matplotlib again in each. "
            "The Dask line runs the same command with `--dask`: its wall time includes starting the LocalCluster "
            "(a scheduler and 2 worker processes), the worker plugin's template load and one task per notebook "
            "(the notebook's bytes out, the executed notebook back).\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench batch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_NOTEBOOKS} notebooks instead of 200")
    p.add_argument("-n", type=int, default=None, help="how many notebooks (overrides --quick)")
    p.add_argument("--json", type=Path, default=common.results_dir() / "batch.json")
    args = p.parse_args(argv)
    res = measure(args.quick, args.n)
    text = markdown(res)
    common.write_results(args.json, "batch", res, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
