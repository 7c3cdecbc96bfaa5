"""`python -m zeroboot_kernel.bench engine`: what forks cost, measured side by side in one run.

Forks from the template, fork + `print(1)` (on new memory, and on the memory a closed fork left
parked), restore-in-place + `print(1)` (what the kernel does per isolated cell), forks of a live
sandbox after a cell that dirtied 1 MiB / 64 MiB, many live forks at once (wall time, USS per fork
and host kernel memory from MemAvailable), the template build, exits and first-touch faults per
cell; and, as references measured in the same run, `subprocess.run(['true'])` and `os.fork()` +
`_exit`.
"""
from __future__ import annotations

import argparse
import gc
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..native import Engine, ffi, lib
from ..template import Template, TemplateConfig, default_preload
from .common import PUBLISHED, memory_sample, per_fork_kb, percentile, results_dir, write_results

PRINT = "print(1)"


def _times(n: int, fn: Callable[[], Any]) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _stat(engine: Engine, name: str) -> int:
    v = ffi.new("uint64_t *")
    return int(v[0]) if lib.zb_engine_vcpu_stat(engine.handle, name.encode(), v) == 0 else -1


def _fork_batch(template: Template, n: int) -> list[float]:
    """Times (ms) of n forks kept alive together, then closed."""
    sandboxes = []

    def fork() -> None:
        sandboxes.append(template.fork())

    t = _times(n, fork)
    for sb in sandboxes:
        sb.close()
    return t


def _forks(template: Template, n: int) -> dict[str, Any]:
    """The first batch of forks in this process pays the host's first touch of the engine's
    per-fork bookkeeping (page bitmaps, ~130 KiB); a long-running kernel reuses that memory. Both
    are reported; fork_p50_ms/p99 are the second batch (steady state)."""
    first = _fork_batch(template, n)
    t = _fork_batch(template, n)
    return {"fork_p50_ms": percentile(t, 50), "fork_p99_ms": percentile(t, 99), "fork_max_ms": max(t), "forks": n,
            "fork_first_batch_p50_ms": percentile(first, 50), "fork_first_batch_p99_ms": percentile(first, 99)}


def _fork_exec(template: Template, engine: Engine, n: int) -> dict[str, Any]:
    """fork + print(1), interleaved: onto a new mapping (parking off: the VM gets new memslots and
    KVM's shadow faults for every page the cell touches) and onto the memory of the fork closed just
    before (parked, the default: a restore in place on warm memslots)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    first_faults: dict[bool, list[int]] = {False: [], True: []}
    exits, faults = [], []
    for _ in range(n):
        for parking in (False, True):
            engine.set_parking(parking)
            if parking:  # something to take: a fork that ran a cell (its VM maps its memory), closed
                with template.fork() as before_it:
                    before_it.execute("pass")
            f0 = _stat(engine, "pf_fixed")
            t = time.perf_counter()
            sb = template.fork()
            sb.execute(PRINT)
            times[parking].append((time.perf_counter() - t) * 1e3)
            first_faults[parking].append(_stat(engine, "pf_fixed") - f0)
            if parking:
                before = _stat(engine, "pf_fixed")
                st0 = sb.guest.stats()["exits"]
                sb.execute(PRINT)  # a second cell in the same fork: what one cell costs once warm
                exits.append(sb.guest.stats()["exits"] - st0)
                faults.append(_stat(engine, "pf_fixed") - before)
            sb.close()
    engine.set_parking(True)
    # a run of forks, each onto the memory of the one before, which ran the same cell (`%%fanout`
    # jobs in a worker, engine API programs that fork, run and close): the steady state of parking
    loop: list[float] = []
    loop_faults: list[int] = []
    for i in range(n + 3):
        f0 = _stat(engine, "pf_fixed")
        t = time.perf_counter()
        sb = template.fork()
        sb.execute(PRINT)
        if i >= 3:  # the first ones warm the memory up
            loop.append((time.perf_counter() - t) * 1e3)
            loop_faults.append(_stat(engine, "pf_fixed") - f0)
        sb.close()
    # restore in place: how the kernel resets a sandbox between isolated cells
    sb = template.fork()
    sb.execute(PRINT)

    def restore_exec() -> None:
        sb.restore(template.snapshot, fresh=True)
        sb.execute(PRINT)

    r = _times(n, restore_exec)
    sb.close()
    return {"fork_exec_p50_ms": percentile(times[False], 50), "fork_exec_p99_ms": percentile(times[False], 99),
            "fork_exec_parked_p50_ms": percentile(times[True], 50),
            "fork_exec_parked_p99_ms": percentile(times[True], 99),
            "fork_exec_loop_p50_ms": percentile(loop, 50), "fork_exec_loop_p99_ms": percentile(loop, 99),
            "first_touch_pages_loop": percentile(loop_faults, 50),
            "restore_exec_p50_ms": percentile(r, 50), "restore_exec_p99_ms": percentile(r, 99),
            "exits_per_print_cell": percentile(exits, 50), "faults_per_warm_print_cell": percentile(faults, 50),
            "first_touch_pages_per_print_cell": percentile(first_faults[False], 50),
            "first_touch_pages_parked": percentile(first_faults[True], 50)}


def _chained(template: Template, mib: int, n: int) -> float:
    sb = template.fork()
    sb.execute(f"import numpy as np; a = np.zeros({mib << 17})")
    times = []
    for i in range(n):
        sb.execute(f"a[:] = {i + 1}")  # the cell dirties `mib` MiB
        t = time.perf_counter()
        child = sb.fork()
        times.append((time.perf_counter() - t) * 1e3)
        if i == 0:
            result = child.execute("float(a[0])").result
            assert result and result["text/plain"] == "1.0", "chained fork lost the parent's state"
        child.close()
    sb.close()
    return percentile(times, 50)


def _concurrent(template: Template, n: int) -> dict[str, Any]:
    gc.collect()
    template.snapshot.engine.release_parked()  # memory per new fork: none of them starts on an earlier one's memory
    before = memory_sample()
    t = time.perf_counter()
    sandboxes = [template.fork() for _ in range(n)]
    created = time.perf_counter() - t
    unstarted = per_fork_kb(before, memory_sample(), n)
    for sb in sandboxes:
        sb.execute(PRINT)
    with_exec = time.perf_counter() - t
    idle = per_fork_kb(before, memory_sample(), n)
    for sb in sandboxes:
        sb.close()
    return {f"concurrent_{n}_s": round(created, 4), f"concurrent_{n}_exec_s": round(with_exec, 3),
            f"unstarted_fork_uss_kb_{n}": unstarted["uss"], f"idle_fork_uss_kb_{n}": idle["uss"],
            f"idle_fork_pss_kb_{n}": idle["pss"], f"host_memory_kb_per_fork_{n}": idle["host"]}


def _references(n: int) -> dict[str, Any]:
    sub = _times(min(n, 100), lambda: subprocess.run(["true"], check=True))

    def fork_exit() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    fk = _times(n, fork_exit)
    return {"ref_subprocess_true_p50_ms": percentile(sub, 50), "ref_os_fork_p50_ms": percentile(fk, 50)}


def _template_build(quick: bool) -> dict[str, Any]:
    """Template builds in an empty cache: numpy only, and (not with --quick: the same build with a
    longer preload list, ~10 s more) the default preload."""
    out = {}
    builds: list[tuple[str, tuple[str, ...]]] = [("template_build_s", ("numpy",))]
    if not quick:
        builds.append(("template_build_full_s", default_preload()))
    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = cache
        try:
            for key, preload in builds:
                t = time.perf_counter()
                Template.build(TemplateConfig(name="bench", preload=preload)).snapshot.release()
                out[key] = round(time.perf_counter() - t, 3)
        finally:
            if old is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = old
    return out


def measure(quick: bool = False) -> dict[str, Any]:
    engine = Engine.default()
    template = Template.ensure()
    # --quick is CI's smoke run (tests/test_bench_quick.py): every path a few times, not statistics
    n_fork = 50 if quick else 1000
    n_exec = 5 if quick else 200
    res: dict[str, Any] = {"quick": quick, "template": template.name, "preload": list(template.manifest["preload"])}
    res.update(_forks(template, n_fork))
    res.update(_fork_exec(template, engine, n_exec))
    res["chained_fork_1mib_p50_ms"] = _chained(template, 1, 3 if quick else 30)
    res["chained_fork_64mib_p50_ms"] = _chained(template, 64, 2 if quick else 10)
    res["chained_fork_p50_ms"] = res["chained_fork_1mib_p50_ms"]
    populations = (20,) if quick else (100, 1000)
    for n in populations:
        res.update(_concurrent(template, n))
    most = populations[-1]
    res["idle_fork_uss_kb"] = res[f"idle_fork_uss_kb_{most}"]
    res["unstarted_fork_uss_kb"] = res[f"unstarted_fork_uss_kb_{most}"]
    res["idle_fork_pss_kb"] = res[f"idle_fork_pss_kb_{most}"]
    res["host_memory_kb_per_fork"] = res[f"host_memory_kb_per_fork_{most}"]
    res["concurrent_forks"] = most
    res["concurrent_s"] = res[f"concurrent_{most}_s"]
    res.update(_references(n_exec))
    res.update(_template_build(quick))
    res["ratio_fork_vs_os_fork"] = round(res["ref_os_fork_p50_ms"] / res["fork_p50_ms"], 1)
    res["ratio_fork_vs_zeroboot_published"] = round(PUBLISHED["zeroboot"]["fork_p50_ms"] / res["fork_p50_ms"], 1)
    res["ratio_fork_exec_vs_subprocess_true"] = round(res["ref_subprocess_true_p50_ms"] / res["fork_exec_p50_ms"], 2)
    return res


TABLE = [
    ("fork from template, p50 / p99 (steady state)", "fork_p50_ms", "fork_p99_ms", "ms", "zeroboot 0.79 / 1.74 (published)"),
    ("the same, first batch of a fresh process", "fork_first_batch_p50_ms", "fork_first_batch_p99_ms", "ms", ""),
    ("fork + print(1), new memory (nothing parked), p50 / p99", "fork_exec_p50_ms", "fork_exec_p99_ms", "ms",
     "zeroboot ~8 (published)"),
    ("fork + print(1) onto a closed fork's parked memory, p50 / p99", "fork_exec_parked_p50_ms",
     "fork_exec_parked_p99_ms", "ms", "zeroboot ~8 (published)"),
    ("KVM shadow faults of that fork's first cell: new memory / parked", "first_touch_pages_per_print_cell",
     "first_touch_pages_parked", "", ""),
    ("fork + print(1) in a run of forks, each onto the last one's memory (it ran the same cell), p50 / p99",
     "fork_exec_loop_p50_ms", "fork_exec_loop_p99_ms", "ms", "zeroboot ~8 (published)"),
    ("KVM shadow faults of a first cell in that run / of a warm print(1) cell", "first_touch_pages_loop",
     "faults_per_warm_print_cell", "", ""),
    ("restore in place + print(1), p50 / p99", "restore_exec_p50_ms", "restore_exec_p99_ms", "ms", ""),
    ("fork of a live sandbox after a 1 MiB / 64 MiB cell", "chained_fork_1mib_p50_ms", "chained_fork_64mib_p50_ms", "ms", ""),
    ("reference: os.fork()+_exit / subprocess true", "ref_os_fork_p50_ms", "ref_subprocess_true_p50_ms", "ms", "same run"),
]


def markdown(res: dict[str, Any]) -> str:
    rows = ["| what | value | unit | compare |", "|---|---|---|---|"]
    for label, a, b, unit, cmp in TABLE:
        digits = 3 if unit else 0  # times in ms; counts
        rows.append(f"| {label} | {res[a]:.{digits}f} / {res[b]:.{digits}f} | {unit} | {cmp} |")
    n = res["concurrent_forks"]
    rows.append(f"| {n:,} live forks: create / create + print(1) each | {res['concurrent_s']:.3f} / "
                f"{res[f'concurrent_{n}_exec_s']:.2f} | s | zeroboot 0.815 for 1,000 (published) |")
    rows.append(f"| host memory per fork before it runs anything (USS) | {res['unstarted_fork_uss_kb']:.0f} | KiB | "
                f"zeroboot ~265 (published) |")
    rows.append(f"| host memory per live fork after one cell: USS / PSS / MemAvailable drop | "
                f"{res['idle_fork_uss_kb']:.0f} / {res['idle_fork_pss_kb']:.0f} / {res['host_memory_kb_per_fork']:.0f} "
                f"| KiB | |")
    rows.append(f"| exits / new page faults per warm print(1) cell | {res['exits_per_print_cell']:.0f} / "
                f"{res['faults_per_warm_print_cell']:.0f} | | |")
    full = f"{res['template_build_full_s']:.2f}" if "template_build_full_s" in res else "not run (--quick)"
    rows.append(f"| template build: numpy / numpy+pandas+matplotlib | {res['template_build_s']:.2f} / "
                f"{full} | s | target <= 3 s (numpy) |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench engine", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a few repetitions of each path (a smoke run, well under a minute)")
    p.add_argument("--json", default=None, help="where to write the results (default bench/results/engine.json)")
    args = p.parse_args(argv)
    res = measure(args.quick)
    write_results(Path(args.json) if args.json else results_dir() / "engine.json", "engine", res, markdown(res) + "\n")
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
