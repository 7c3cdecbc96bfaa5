"""`python -m zeroboot_kernel.bench peers`: the same cells, isolated the ways a user could pick instead.

Every cell runs in a fresh isolated environment, measured in one run, interleaved case by case:
  zeroboot     a pooled VM reset to the template (copy-on-write restore in place), then the cell:
               what the kernel does for every cell in isolated mode (in-process engine)
  zeroboot new fork
               a new copy-on-write fork of the template VM, the cell, the fork closed: every page
               the cell touches is a first touch in a new VM (8-20 us each on this host); on an
               engine of its own, so that it does not disturb the pooled VM
  subprocess   `python -c CELL`: a new process per cell, no isolation beyond the process
  bubblewrap   `bwrap ... python -c CELL`: new namespaces (mount, pid, net, ipc, uts, user) per
               cell over a read-only root, what many sandboxes use
Because a fresh process has nothing imported, the cells are written to stand alone (the numpy and
matplotlib imports are part of the cell); the template already has them imported, which is the
point of forking a warm process. Also: creating an empty sandbox (a reset / a fork / `true` / `bwrap true`),
and the published numbers of zeroboot and E2B, shown as published (not measured here).
Each peer is reported as a ratio to zeroboot's number (peer / zeroboot: how many times slower).
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..guest_view import THREAD_ENV
from ..native import Engine
from ..template import Template
from . import common

log = logging.getLogger(__name__)

# name -> a cell that runs on its own in a fresh interpreter
CELLS = {
    "1+1": "print(1 + 1)",
    "print 10 KB": "print('x' * 10_000)",
    "numpy matmul 512": "import numpy as np\na = np.random.default_rng(0).random((512, 512))\nb = a @ a",
    "matplotlib PNG": ("import io, matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
                       "plt.plot([1, 3, 2])\nplt.savefig(io.BytesIO(), format='png')"),
}


def bwrap_args() -> list[str]:
    """bubblewrap's options: the host's root read-only, a private /tmp, every namespace unshared.
    An interpreter that lives under /tmp (a checkout there) is bound back over the private /tmp."""
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in sorted({sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}):
        if path.startswith("/tmp/"):
            args += ["--ro-bind", path, path]
    return [*args, "--unshare-all", "--die-with-parent", "--new-session", "--"]


def _env() -> dict[str, str]:
    return {**os.environ, **THREAD_ENV}  # single-threaded BLAS everywhere, as in the guest


def _run(cmd: list[str]) -> None:
    common.time_command(cmd, env=_env(), timeout=120)


def peer_prefixes() -> dict[str, list[str]]:
    """The process-based peers available on this machine (bubblewrap only if installed), each as
    what goes before the command it runs in a fresh sandbox."""
    peers: dict[str, list[str]] = {"subprocess": []}
    bwrap = shutil.which("bwrap")
    if bwrap:
        peers["bubblewrap"] = [bwrap, *bwrap_args()]
    else:
        log.warning("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` to compare with it")
    return peers


def _check(sb: Any, code: str) -> None:
    r = sb.execute(code)
    if r.status != "ok":
        raise RuntimeError(f"zeroboot: {code!r} failed: {r.error}")


def _new_fork_cell(template: Template, code: str) -> None:
    with template.fork() as sb:
        _check(sb, code)


def _reset_cell(template: Template, pooled: Any, code: str | None) -> None:
    pooled.restore(template.snapshot, fresh=True)
    if code is not None:
        _check(pooled, code)


def _ms(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def measure(runs: int = 20) -> dict[str, Any]:
    template = Template.ensure()
    pooled = template.fork()
    # New forks run on an engine of their own: on the same one, every switch between them and the
    # pooled sandbox would re-point the VM's memory slot and drop its warm page tables, which no
    # kernel session sees (it runs one sandbox).
    template_for_forks = Template.ensure(engine=Engine())
    peers = peer_prefixes()
    true = shutil.which("true") or "/bin/true"  # an empty sandbox: a process that does nothing
    sides = ["zeroboot", "zeroboot new fork", *peers]
    tasks: dict[str, dict[str, Callable[[], Any]]] = {
        "empty sandbox": {"zeroboot": functools.partial(_reset_cell, template, pooled, None),
                          "zeroboot new fork": lambda: template_for_forks.fork().close(),
                          **{name: functools.partial(_run, [*pre, true]) for name, pre in peers.items()}},
    }
    for case, code in CELLS.items():
        tasks[case] = {"zeroboot": functools.partial(_reset_cell, template, pooled, code),
                       "zeroboot new fork": functools.partial(_new_fork_cell, template_for_forks, code),
                       **{name: functools.partial(_run, [*pre, sys.executable, "-c", code])
                          for name, pre in peers.items()}}
    cases: dict[str, Any] = {}
    for case, fns in tasks.items():
        for fn in fns.values():  # warm-up: page cache, bytecode, first fork
            fn()
        samples: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(runs):
            for side in sides:
                samples[side].append(_ms(fns[side]))
        row: dict[str, Any] = {}
        for side, xs in samples.items():
            row[side] = {"p50_ms": common.percentile(xs, 50), "p99_ms": common.percentile(xs, 99), "n": len(xs)}
        for side in sides[1:]:
            row[side]["ratio_p50"] = round(row[side]["p50_ms"] / row["zeroboot"]["p50_ms"], 1)
        cases[case] = row
        log.info("peers: %s done", case)
    pooled.close()
    return {"runs": runs, "sides": sides, "cells": CELLS, "cases": cases, "published": common.PUBLISHED}


def markdown(res: dict[str, Any]) -> str:
    sides = res["sides"]
    headers = ["fresh sandbox per cell (p50 ms)", *sides, *(f"{s} / zeroboot" for s in sides[1:])]
    rows = []
    for case, row in res["cases"].items():
        rows.append([case, *(row[s]["p50_ms"] for s in sides), *(f"{row[s]['ratio_p50']}x" for s in sides[1:])])
    table = common.markdown_table(headers, rows)
    z, e = res["published"]["zeroboot"], res["published"]["E2B"]
    return (table + f"\n{res['runs']} interleaved runs per case. zeroboot = a pooled VM reset to the template + "
            "execute (the isolated kernel's path); zeroboot new fork = fork of the template VM + execute + close "
            "(in-process engines, one for each of the two); subprocess = `python -c CELL`; bubblewrap = `bwrap --unshare-all "
            "--ro-bind / / ... python -c CELL`. \"empty sandbox\" is a reset / a fork / `true` / `bwrap true`.\n"
            f"Published, not measured here: zeroboot fork p50 {z['fork_p50_ms']} ms, p99 {z['fork_p99_ms']} ms, "
            f"fork+exec ~{z['fork_exec_ms']:.0f} ms, ~{z['kb_per_fork']} KB/fork ({z['source']}); "
            f"E2B ~{e['create_ms']} ms per sandbox ({e['source']}).\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20, help="measured runs per case and side (default 20)")
    p.add_argument("--json", type=Path, default=common.results_dir() / "peers.json")
    args = p.parse_args(argv)
    res = measure(args.runs)
    text = markdown(res)
    common.write_results(args.json, "peers", res, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
