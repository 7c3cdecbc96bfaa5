"""`python -m zeroboot_kernel.bench processes`: guest processes (issue 15), guest vs host in one run.

os.fork() + os.waitpid() of the Python process: the guest's (the agent's CPython in a fork of the
template, where a fork is a copy-on-write sandbox fork run on the same executor VM) against a
fresh host CPython's (a subprocess of this one, so no engine or VM is in the forked process),
each timed inside its own process, and against a host CPython that first imported what the
guest's has (IPython and the template's preloads: numpy, pandas, matplotlib), the process a
notebook's fork copies under ipykernel (a host fork copies the page tables of all it mapped); a fork + pipe round trip (the child writes 1 byte, the
parent reads it and waits); subprocess.run of /bin/true (fork, execve, wait) and of a shell
pipeline (sh forks two children that exec echo and cat); multiprocessing.Pool(2).map of 100
small tasks with the fork start method (pool start, the map, close + join: its locks are
semaphores in shared memory, woken across processes); and a multiprocessing.Manager() whose dict
4 processes write (its server is a process, each proxy call a round trip over an AF_UNIX socket);
fewer iterations of the last two (POOL_ITERATIONS).

Then where a guest fork+wait's time goes (BREAKDOWN): perf_counter_ns stamps in the parent (before
fork, when fork returns, when waitpid returns) and in the child (when fork returns 0, before
_exit; written to a MAP_SHARED page the parent reads), and the engine's counters of the family
(zb_stats proc_*: making the child, attaching a process to the executor VM, the child's run,
ending it) with KVM's fixed page faults of the executor vCPU (pf_fixed), per fork. On the host the
parent and child run at once on two cores, so its child-side phases overlap the parent's.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..native import Engine, ffi, lib
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
    "subprocess.run(['true'])": (
        "import subprocess, time\nts = []\n"
        "for _ in range({n}):\n"
        "    t0 = time.perf_counter(); subprocess.run(['true'], check=True); ts.append(time.perf_counter() - t0)\n"
        "print(*ts)"),
    "subprocess.run('echo hi | cat', shell=True)": (
        "import subprocess, time\nts = []\n"
        "for _ in range({n}):\n"
        "    t0 = time.perf_counter()\n"
        "    assert subprocess.run('echo hi | cat', shell=True, check=True, capture_output=True).stdout == b'hi\\n'\n"
        "    ts.append(time.perf_counter() - t0)\n"
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
    "multiprocessing.Manager(), a dict from 4 processes": (
        "import multiprocessing as mp, time\nts = []\n"
        "def put(d, i): d[i] = i * i\n"
        "for _ in range({n}):\n"
        "    t0 = time.perf_counter()\n"
        "    with mp.get_context('fork').Manager() as m:\n"
        "        d = m.dict()\n"
        "        ps = [mp.get_context('fork').Process(target=put, args=(d, i)) for i in range(4)]\n"
        "        [p.start() for p in ps]; [p.join() for p in ps]\n"
        "        assert dict(d) == {{i: i * i for i in range(4)}}\n"
        "    ts.append(time.perf_counter() - t0)\n"
        "print(*ts)"),
}
# A pool's or a Manager's start, use and end is a whole sequence of forks and hand-overs: fewer of them.
POOL_ITERATIONS = 5

# The timeline of one fork + wait: one line per iteration, five ns values (see PHASES).
BREAKDOWN = (
    "import os, time, mmap\nm = mmap.mmap(-1, 16)\n"
    "for _ in range({n}):\n"
    "    t0 = time.perf_counter_ns(); pid = os.fork()\n"
    "    if pid == 0:\n"
    "        c0 = time.perf_counter_ns(); m[0:8] = c0.to_bytes(8, 'little')\n"
    "        m[8:16] = time.perf_counter_ns().to_bytes(8, 'little'); os._exit(0)\n"
    "    t1 = time.perf_counter_ns(); os.waitpid(pid, 0); t2 = time.perf_counter_ns()\n"
    "    c0 = int.from_bytes(m[0:8], 'little'); c1 = int.from_bytes(m[8:16], 'little')\n"
    "    print(t1 - t0, c0 - t1, c1 - c0, t2 - c1, t2 - t0)\n")
PHASES = ("fork() returns in the parent (the child is made)",
          "parent to waitpid + the child's first run to its first stamp",
          "the child's Python (two stamps, a shared-page write)",
          "child's _exit to the parent's waitpid return (exit, reaping, wake)",
          "total fork + wait")
# engine counters of the family (zb_stats), per fork: (label, stat, divisor to ms or count)
COUNTERS = (("making the child (snapshot + fork)", "proc_fork_ns"),
            ("attaching a process to the executor VM", "proc_attach_ns"),
            ("the child's run on the executor (its faults in it)", "proc_child_run_ns"),
            ("ending the child (zombie, free)", "proc_end_ns"))


def _vcpu_stat(engine: Engine, name: str) -> int:
    v = ffi.new("uint64_t *")
    return int(v[0]) if lib.zb_engine_vcpu_stat(engine.handle, name.encode(), v) == 0 else -1


def _phase_medians(text: str) -> list[float]:
    rows = [[int(x) for x in line.split()] for line in text.strip().splitlines()]
    if not rows or any(len(r) != len(PHASES) for r in rows):
        raise RuntimeError(f"the breakdown snippet printed {text!r}, not {len(PHASES)} numbers a line")
    return [round(statistics.median(r[k] for r in rows) / 1e6, 3) for k in range(len(PHASES))]


def breakdown(sb: Any, engine: Engine, n: int) -> dict[str, Any]:
    """Where the guest's fork + wait goes, against the host's same timeline (see the module's doc)."""
    src = BREAKDOWN.format(n=n)
    st0, pf0 = sb.guest.stats(), _vcpu_stat(engine, "pf_fixed")
    r = sb.execute(src)
    st1, pf1 = sb.guest.stats(), _vcpu_stat(engine, "pf_fixed")
    assert r.status == "ok", r
    forks = st1["proc_forks"] - st0["proc_forks"]
    if forks != n:
        raise RuntimeError(f"the breakdown made {forks} forks, not {n}: the counters would not be per fork")
    host = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, check=True).stdout
    engine_rows = {label: round((st1[k] - st0[k]) / n / 1e6, 3) for label, k in COUNTERS}
    return {"phases": dict(zip(PHASES, zip(_phase_medians(r.stdout), _phase_medians(host)))),
            "engine_ms_per_fork": engine_rows,
            "attaches_per_fork": round((st1["proc_attaches"] - st0["proc_attaches"]) / n, 2),
            "switches_per_fork": round((st1["proc_switches"] - st0["proc_switches"]) / n, 2),
            "pf_fixed_per_fork": round((pf1 - pf0) / n) if pf0 >= 0 and pf1 >= 0 else None}


def _times(text: str) -> list[float]:
    return [float(x) for x in text.split()]


def _host_times(src: str, imports: list[str]) -> list[float]:
    """The snippet's times in a fresh host CPython that first imported these modules."""
    prelude = "".join(f"import {name}\n" for name in imports)
    return _times(subprocess.run([sys.executable, "-c", prelude + src], capture_output=True, text=True,
                                 check=True).stdout)


def measure(n: int = 20) -> dict[str, Any]:
    template = Template.ensure()
    engine = Engine.default()
    imports = ["IPython", *template.manifest.get("preload", [])]
    res: dict[str, Any] = {"iterations": n, "rows": {}, "host_imports": imports}
    with template.fork() as sb:
        sb.execute("0")  # the executor exists (its KVM counters can be read) and the agent is warm
        res["breakdown"] = breakdown(sb, engine, n)
        for label, code in SNIPPETS.items():
            src = code.format(n=min(n, POOL_ITERATIONS) if "Pool" in label or "Manager" in label else n)
            r = sb.execute(src)
            assert r.status == "ok", r
            guest = _times(r.stdout)
            host = _host_times(src, [])
            same = _host_times(src, imports)
            res["rows"][label] = {"guest_ms_median": round(statistics.median(guest) * 1e3, 2),
                                  "guest_ms_min": round(min(guest) * 1e3, 2),
                                  "host_ms_median": round(statistics.median(host) * 1e3, 2),
                                  "host_ms_min": round(min(host) * 1e3, 2),
                                  "host_imports_ms_median": round(statistics.median(same) * 1e3, 2)}
    return res


def markdown(res: dict[str, Any]) -> str:
    def ratio(a: float, b: float | None) -> Any:
        return round(a / b, 2) if b else "-"

    rows = [[label, v["guest_ms_median"], v["guest_ms_min"], v["host_ms_median"], v["host_ms_min"],
             ratio(v["guest_ms_median"], v["host_ms_median"]), v.get("host_imports_ms_median", "-"),
             ratio(v["guest_ms_median"], v.get("host_imports_ms_median"))]
            for label, v in res["rows"].items()]
    out = markdown_table([f"processes (x{res['iterations']})", "guest ms (median)", "guest ms (min)",
                          "host ms (median)", "host ms (min)", "guest / host",
                          "host ms, same imports (median)", "guest / host, same imports"], rows)
    if res.get("host_imports"):
        out += (f"\nHost, same imports: a host CPython that imported {', '.join(res['host_imports'])} first, "
                f"as the guest's agent has (a notebook's kernel process under ipykernel).\n")
    b = res.get("breakdown")
    if not b:
        return out
    phase_rows = [[label, g, h] for label, (g, h) in b["phases"].items()]
    out += "\n" + markdown_table(["os.fork + os.waitpid, phase (median)", "guest ms", "host ms"], phase_rows)
    eng = [[label, ms] for label, ms in b["engine_ms_per_fork"].items()]
    eng.append(["executor attaches / switches per fork", f"{b['attaches_per_fork']} / {b['switches_per_fork']}"])
    if b.get("pf_fixed_per_fork") is not None:
        eng.append(["KVM page faults fixed per fork (pf_fixed)", b["pf_fixed_per_fork"]])
    out += "\n" + markdown_table(["engine, per fork (mean)", "host ms"], eng)
    return out


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
