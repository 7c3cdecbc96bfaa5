"""`python -m zeroboot_kernel.bench syscalls`: syscall-heavy work, guest vs host in the same run.

Each case runs the same Python code inside a fork of the template (the notebook's folder mounted
as a project in overlay mode) and on the host, and reports time per operation on both sides, the
ratio and, for the guest, the syscalls and VM exits one operation cost (from the engine's stats):
getpid (answered by the syscall entry in the guest on PVM), a trivial syscall that exits
(getppid), `os.stat`, open+read+close of a 4 KiB file, `os.listdir` of a big folder (in the
notebook's folder and in the guest's private /tmp, which lives in the overlay),
`os.walk` of a tree, reading many small CSV files (pandas when the template has it, else the
csv module) and `import scipy` when scipy is installed (`pip install -e .[bench]`): a package the
template has not preloaded, so every import reads and stats its files. The per-syscall profile
(`Guest.syscall_profile_by_number`) of getppid, os.stat, open+read+close and os.walk follows.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..template import Template
from .common import markdown_table, results_dir, write_results

# case -> (operations per repetition, repetitions); the quick mode uses QUICK
FULL = {"listdir_entries": 50_000, "walk_files": 5_000, "csv_files": 2_000, "getpid": 5_000, "getppid": 5_000, "stat": 2_000,
        "read4k": 1_000, "reps": 3}
QUICK = {"listdir_entries": 2_000, "walk_files": 500, "csv_files": 100, "getpid": 500, "getppid": 500, "stat": 200,
         "read4k": 100, "reps": 1}

# One program for both sides: `CASE` and `ARGS` are bound before it runs; it prints one JSON line
# {"seconds": best of the repetitions, "ops": operations per repetition, "check": a result to compare}.
_PROGRAM = r'''
import json, os, time
def _run(case, a):
    if case in ("getpid", "getppid"):
        n = a["n"]
        def once():
            g = getattr(os, case)
            for _ in range(n): g()
            return n
    elif case == "stat":
        n, p = a["n"], a["path"]
        def once():
            s = os.stat
            for _ in range(n): s(p)
            return os.stat(p).st_size
    elif case == "read4k":
        n, p = a["n"], a["path"]
        def once():
            for _ in range(n):
                with open(p, "rb") as f: b = f.read()
            return len(b)
    elif case == "listdir":
        p = a["path"]
        def once(): return len(os.listdir(p))
    elif case == "walk":
        p = a["path"]
        def once(): return sum(len(files) for _, _, files in os.walk(p))
    elif case == "csv":
        p = a["path"]
        names = sorted(os.listdir(p))
        try:
            import pandas as pd
            def once(): return int(pd.concat(pd.read_csv(os.path.join(p, f)) for f in names)["v"].sum())
        except ImportError:
            import csv
            def once():
                t = 0
                for f in names:
                    with open(os.path.join(p, f), newline="") as fh:
                        t += sum(int(r["v"]) for r in csv.DictReader(fh))
                return t
    elif case == "mkfiles":  # the guest's /tmp listing needs files made inside the guest
        p = a["path"]
        os.makedirs(p, exist_ok=True)
        for i in range(a["n"]): open(os.path.join(p, f"f{i:06d}.txt"), "w").close()
        print(json.dumps({"seconds": 0, "ops": 0, "check": len(os.listdir(p))}))
        return
    best, check = None, None
    for _ in range(a["reps"]):
        t = time.perf_counter()
        check = once()
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    print(json.dumps({"seconds": best, "check": check}))
_run(CASE, ARGS)
'''


def _host_run(case: str, args: dict[str, Any]) -> dict[str, Any]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_PROGRAM, "<bench syscalls>", "exec"), {"CASE": case, "ARGS": args, "__name__": "bench"})
    return json.loads(out.getvalue().strip().splitlines()[-1])


def _guest_run(sb: Any, case: str, args: dict[str, Any]) -> dict[str, Any]:
    st0 = sb.guest.stats()
    r = sb.execute(f"CASE = {case!r}\nARGS = {args!r}\n{_PROGRAM}")
    st1 = sb.guest.stats()
    if r.error or not r.stdout.strip():
        raise RuntimeError(f"bench syscalls: case {case} failed in the guest: {r.error or r.stdout!r}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["syscalls"] = st1["syscalls"] - st0["syscalls"]
    res["exits"] = st1["exits"] - st0["exits"]
    return res


def _make_tree(root: str, nfiles: int, per_dir: int = 50) -> None:
    for i in range(nfiles):
        d = os.path.join(root, f"d{i // (per_dir * 10):03d}", f"e{(i // per_dir) % 10}")
        if i % per_dir == 0:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:05d}.txt"), "w") as f:
            f.write("x")


def _make_data(d: str, size: dict[str, int]) -> dict[str, str]:
    paths = {"small": os.path.join(d, "small.txt"), "big": os.path.join(d, "big"), "tree": os.path.join(d, "tree"),
             "csv": os.path.join(d, "csv")}
    with open(paths["small"], "wb") as f:
        f.write(os.urandom(4096))
    os.mkdir(paths["big"])
    for i in range(size["listdir_entries"]):
        open(os.path.join(paths["big"], f"f{i:06d}.txt"), "w").close()
    _make_tree(paths["tree"], size["walk_files"])
    os.mkdir(paths["csv"])
    for i in range(size["csv_files"]):
        with open(os.path.join(paths["csv"], f"part{i:05d}.csv"), "w") as f:
            f.write("a,b,v\n" + "".join(f"{j},x{j},{i + j}\n" for j in range(20)))
    return paths


def _row(name: str, ops: int, guest: dict[str, Any], host: dict[str, Any]) -> dict[str, Any]:
    if guest["check"] != host["check"]:
        raise RuntimeError(f"bench syscalls: {name}: the guest saw {guest['check']!r}, the host {host['check']!r}")
    g_us, h_us = guest["seconds"] / ops * 1e6, host["seconds"] / ops * 1e6
    return {"ops": ops, "guest_us_per_op": round(g_us, 2), "host_us_per_op": round(h_us, 3),
            "guest_s": round(guest["seconds"], 4), "host_s": round(host["seconds"], 4),
            "ratio": round(g_us / h_us, 1) if h_us > 0 else None,
            "syscalls_per_op": round(guest["syscalls"] / ops / max(1, guest["reps"]), 2),
            "exits_per_op": round(guest["exits"] / ops / max(1, guest["reps"]), 2)}


def breakdown(sb: Any, path: str, n: int) -> dict[str, dict[str, float]]:
    """Per-phase host time of one syscall (us), from the engine's syscall profile, next to the
    time the guest measured per call: getppid (no work; getpid is answered in the guest) and
    os.stat of a notebook-folder file."""
    out = {}
    for name, code in (("getppid", "os.getppid()"), ("os.stat", f"os.stat({path!r})")):
        sb.execute(f"import os\nfor _ in range(50): {code}")  # warm
        sb.guest.set_profile(True)
        r = sb.execute(f"import os, time\nt = time.perf_counter()\nfor _ in range({n}): {code}\n"
                       f"print((time.perf_counter() - t) / {n})")
        sb.guest.set_profile(False)
        prof = sb.guest.syscall_profile()
        calls = max(1, prof["syscalls"])
        row = {k[:-3] + "_us": round(v / calls / 1e3, 2) for k, v in prof.items() if k.endswith("_ns")}
        row["guest_measured_us"] = round(float(r.stdout.split()[-1]) * 1e6, 2)
        out[name] = row
    return out


# the operations whose syscalls `per_syscall` profiles, one at a time (n: repetitions)
PROFILED = {"getppid": "os.getppid()", "os.stat": "os.stat({small!r})",
            "open+read+close 4 KiB": "open({small!r}, 'rb').read()",
            "os.walk": "sum(len(f) for _, _, f in os.walk({tree!r}))"}


def per_syscall(sb: Any, paths: dict[str, str], n: int) -> dict[str, Any]:
    """For each operation of PROFILED: per syscall number, the calls one operation makes and the
    host time of each phase (us per call), from the engine's per-number profile
    (`Guest.syscall_profile_by_number`), and the guest-measured time per operation."""
    out: dict[str, Any] = {}
    for name, template in PROFILED.items():
        code = template.format(**paths)
        reps = 1 if name == "os.walk" else n
        sb.execute(f"import os\nfor _ in range(3): {code}")  # warm
        sb.guest.set_profile(True)
        r = sb.execute(f"import os, time\nt = time.perf_counter()\nfor _ in range({reps}): {code}\n"
                       f"print((time.perf_counter() - t) / {reps})")
        sb.guest.set_profile(False)
        if r.error:
            raise RuntimeError(f"bench syscalls: profiling {name} failed in the guest: {r.error}")
        rows = {}
        for sc, v in sb.guest.syscall_profile_by_number().items():
            calls = max(1, v["calls"])
            per_op = v["calls"] / reps
            if per_op < 0.5 and name != "os.walk":
                continue  # the timing code's own syscalls
            rows[sc] = {"per_op": round(per_op, 2), "exit_us": round(v["exit_ns"] / calls / 1e3, 2),
                        "dispatch_us": round(v["dispatch_ns"] / calls / 1e3, 2),
                        "host_calls": round(v["host_calls"] / calls, 2),
                        "return_us": round(v["return_ns"] / calls / 1e3, 2)}
        out[name] = {"guest_us_per_op": round(float(r.stdout.split()[-1]) * 1e6, 2), "syscalls": rows}
    return out


def per_syscall_markdown(p: dict[str, Any]) -> str:
    rows = []
    for op, v in p.items():
        for i, (sc, x) in enumerate(sorted(v["syscalls"].items(), key=lambda kv: -kv[1]["per_op"])):
            rows.append([op if i == 0 else "", f"{v['guest_us_per_op']:,.1f}" if i == 0 else "", sc, x["per_op"],
                         x["exit_us"], x["dispatch_us"], x["host_calls"], x["return_us"]])
    return ("\nPer syscall (`Guest.syscall_profile_by_number`; us per call; exit = KVM_RUN that ended in the "
            "syscall's exit + decode, host calls = host system calls the file layer made per call):\n\n" +
            markdown_table(["operation", "guest us/op", "syscall", "calls/op", "exit us", "handler us",
                            "host calls", "return us"], rows))


# a bare I/O exit from CPL3: `in al, dx` on the UART's scratch register (0x3ff), then `ret`
_IN_EXIT = r"""
import ctypes, mmap
_m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
_m.write(bytes([0x66, 0xba, 0xff, 0x03, 0xec, 0xc3]))
in_exit = ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(_m)))
_libc = ctypes.CDLL(None)
def close_exiting(fd):  # the same close with a high-bit fd, which the entry never answers (Linux drops the bits)
    _libc.syscall(3, ctypes.c_long(fd | 1 << 32))
def close_libc(fd):  # the same call path without the high bits: deferred where the entry defers it
    _libc.syscall(3, ctypes.c_long(fd))
_stubs = []
def own_getppid():  # getppid through a `syscall` of its own (mov eax, 110; syscall; ret), new each time
    m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(bytes([0xb8, 110, 0, 0, 0, 0x0f, 0x05, 0xc3]))
    _stubs.append(m)
    return ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
"""
# (name, sync_regs, direct_entry, guest_answers, site_rewrite): Engine.set_syscall_path's switches
PATHS = [("ioctls, page-fault entry (before)", False, False, False, False),
         ("kvm_run registers, page-fault entry", True, False, False, False),
         ("kvm_run registers, entry at LSTAR, every syscall exits", True, True, False, False),
         ("the same + answered by the entry in the guest: getpid/getuid/getgid, lseek(SEEK_CUR), TCGETS, F_GETFD/F_GETFL, "
          "read at the end, fstat of the file just opened, getdents64 at the end, close of a read-only file deferred to the next exit, "
          "reads of a small file just opened from the bytes read at its open, rt_sigaction queries (PVM)", True, True, True, False),
         ("the same + syscall sites rewritten at their second exit: into the port's `out`, or for a number the entry "
          "answers into a jump to a stub of the entry (now)", True, True, True, True)]


def path_variants(sb: Any, small: str, rounds: int, n: int) -> dict[str, dict[str, float]]:
    """The syscall path's variants (Engine.set_syscall_path) interleaved in one sandbox, `rounds`
    times: best us per getpid, getppid (glibc's, and through a new `syscall` of its own each time,
    which only the last variant rewrites), os.stat, open+read+close (also with the close made by
    syscall(), once deferrable and once with a high-bit fd that always exits), and per bare `in`
    exit (the floor). glibc's sites the template's start-up ran twice are rewritten (or stubbed)
    in every variant (the template was made with rewriting on): its getppid's is rewritten at its
    second exit in the sandbox."""
    from ..native import Engine

    engine = Engine.default()
    sb.execute(_IN_EXIT)
    ops = {"in exit (floor)": "in_exit()", "getpid": "os.getpid()", "getppid (glibc's site)": "os.getppid()",
           "getppid (a new site)": "own()",
           "os.stat": f"os.stat({small!r})",
           "open+read+close 4 KiB": f"open({small!r}, 'rb').read()",
           "os.open+read, close by syscall()": f"fd = os.open({small!r}, os.O_RDONLY); os.read(fd, 65536); close_libc(fd)",
           "the same, close exits": f"fd = os.open({small!r}, os.O_RDONLY); os.read(fd, 65536); close_exiting(fd)"}
    out: dict[str, dict[str, float]] = {name: {} for name, *_ in PATHS}
    try:
        for _ in range(rounds):
            for name, sync_regs, entry, answers, rewrite in PATHS:
                engine.set_syscall_path(sync_regs, entry, answers, rewrite)
                for op, code in ops.items():
                    k = n // 4 if "open" in op or "same" in op else n
                    r = sb.execute(f"import os, time\nown = own_getppid()\nt = time.perf_counter()\nfor _ in range({k}): {code}\n"
                                   f"print((time.perf_counter() - t) / {k} * 1e6)")
                    us = float(r.stdout.split()[-1])
                    out[name][op] = round(min(out[name].get(op, us), us), 1)
    finally:
        engine.set_syscall_path()
    return out


def path_markdown(v: dict[str, dict[str, float]]) -> str:
    ops = list(next(iter(v.values())))
    return ("\nThe syscall path, variants interleaved in one sandbox (`Engine.set_syscall_path`; best us per "
            "operation):\n\n" + markdown_table(["path", *ops], [[name, *[x[o] for o in ops]] for name, x in v.items()]))


IMPORTS = ("scipy", "scipy.stats")  # `import X` in a fresh fork / a fresh host process


def import_times(template: Any, runs: int) -> dict[str, Any]:
    """Best of `runs` of `import X` (not preloaded) in a fresh host Python that has imported what the
    template preloads (numpy at least) and, interleaved, in two forks of the template: one on fresh
    memory (the engine's parked memory given back first: what a new kernel's first import pays,
    every page a shadow fault) and one on the parked memory of that fork (a `%sandbox reset` or an
    isolated cell after an import of it: its pages are warm)."""
    import subprocess
    import sys

    try:
        import scipy  # noqa: F401
    except ImportError:
        return {"skipped": "scipy is not installed (pip install -e .[bench])"}
    out: dict[str, Any] = {}
    pre = "import numpy"

    def in_fork(code: str, mod: str) -> float:
        with template.fork() as sb:
            r = sb.execute(code)
            if r.error:
                raise RuntimeError(f"bench syscalls: import {mod} failed in the guest: {r.error}")
            return float(r.stdout.split()[-1])

    for mod in IMPORTS:
        code = f"{pre}\nimport time\nt = time.perf_counter()\nimport {mod}\nprint(time.perf_counter() - t)"
        fresh, parked, h = [], [], []
        for _ in range(runs):
            template.snapshot.engine.release_parked()
            fresh.append(in_fork(code, mod))
            parked.append(in_fork(code, mod))
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            h.append(float(p.stdout.split()[-1]))
        out[f"import {mod}"] = {"guest_s": round(min(fresh), 4), "guest_parked_s": round(min(parked), 4),
                                "host_s": round(min(h), 4), "ratio": round(min(fresh) / min(h), 2),
                                "ratio_parked": round(min(parked) / min(h), 2)}
    return out


def measure(quick: bool = False) -> dict[str, Any]:
    size = dict(QUICK if quick else FULL)
    reps = size["reps"]
    template = Template.ensure()
    res: dict[str, Any] = {"quick": quick, "sizes": size, "rows": {}}
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as d:
        paths = _make_data(d, size)
        with template.fork() as sb:
            sb.guest.mount_project(d, "overlay")
            guest_tmp = "/tmp/zb-bench-listdir"
            made = _guest_run(sb, "mkfiles", {"path": guest_tmp, "n": size["listdir_entries"]})
            assert made["check"] == size["listdir_entries"], made
            host_tmp = os.path.join(d, "hosttmp")
            os.mkdir(host_tmp)
            for i in range(size["listdir_entries"]):
                open(os.path.join(host_tmp, f"f{i:06d}.txt"), "w").close()
            cases: list[tuple[str, str, int, dict[str, Any], dict[str, Any] | None]] = [  # (row name, case, operations per repetition, guest args, host args)
                ("getpid (answered in the guest on PVM)", "getpid", size["getpid"], {"n": size["getpid"]}, None),
                ("getppid (a trivial syscall that exits)", "getppid", size["getppid"], {"n": size["getppid"]}, None),
                ("os.stat", "stat", size["stat"], {"n": size["stat"], "path": paths["small"]}, None),
                ("open+read+close 4 KiB", "read4k", size["read4k"], {"n": size["read4k"], "path": paths["small"]}, None),
                (f"os.listdir {size['listdir_entries']:,} (notebook folder)", "listdir", 1, {"path": paths["big"]}, None),
                (f"os.listdir {size['listdir_entries']:,} (overlay /tmp)", "listdir", 1, {"path": guest_tmp},
                 {"path": host_tmp}),
                (f"os.walk {size['walk_files']:,} files", "walk", 1, {"path": paths["tree"]}, None),
                (f"read {size['csv_files']:,} small CSVs", "csv", 1, {"path": paths["csv"]}, None),
            ]
            for name, case, ops, gargs, hargs in cases:
                gargs = {**gargs, "reps": reps}
                host = _host_run(case, {**(hargs or gargs), "reps": reps})
                guest = _guest_run(sb, case, gargs)
                guest["reps"] = reps
                res["rows"][name] = _row(name, ops, guest, host)
            res["breakdown"] = breakdown(sb, paths["small"], 200 if quick else 2000)
            res["per_syscall"] = per_syscall(sb, paths, 100 if quick else 500)
            res["paths"] = path_variants(sb, paths["small"], 1 if quick else 3, 200 if quick else 1000)
        res["imports"] = import_times(template, 1 if quick else 3)
    try:
        import pandas  # noqa: F401
        res["csv_reader"] = "pandas"
    except ImportError:
        res["csv_reader"] = "csv module"
    return res


def markdown(res: dict[str, Any]) -> str:
    rows = [[name, f"{v['guest_us_per_op']:,.1f}", f"{v['host_us_per_op']:,.2f}", v["ratio"], v["syscalls_per_op"],
             v["exits_per_op"]] for name, v in res["rows"].items()]
    note = (f"\nGuest syscalls and VM exits include the time-measuring code (a few per operation for the "
            f"whole-folder cases). CSVs read with {res.get('csv_reader', 'pandas')}.\n")
    table = markdown_table(["operation", "guest us/op", "host us/op", "guest/host", "guest syscalls/op",
                            "guest exits/op"], rows) + note
    imports = res.get("imports", {})
    if imports.get("skipped"):
        table += f"\n`import scipy`: not measured, {imports['skipped']}.\n"
    elif imports:
        table += "\nImports not preloaded by the template (best of the runs; a fresh host process with numpy " \
                 "imported; a fork on fresh memory, what a new kernel's first import pays, and a fork on the " \
                 "parked memory of one that imported it):\n\n" + markdown_table(
                     ["import", "guest s (fresh memory)", "guest s (parked memory)", "host s", "guest/host",
                      "guest/host (parked)"],
                     [[k, v["guest_s"], v.get("guest_parked_s", "-"), v["host_s"], v["ratio"],
                       v.get("ratio_parked", "-")] for k, v in imports.items()])
    return table + (breakdown_markdown(res["breakdown"]) if "breakdown" in res else "") + \
        (per_syscall_markdown(res["per_syscall"]) if "per_syscall" in res else "") + \
        (path_markdown(res["paths"]) if "paths" in res else "")


PHASES = [("kvm_run_us", "KVM_RUN: return registers applied, guest entry, the `out` (a rewritten site's; os.stat's newfstatat: the entry's, through its site's stub), exit"),
          ("decode_us", "exit decode (registers from kvm_run)"),
          ("dispatch_us", "handler (all in)"), ("path_us", "  of which path copy + namespace walk"),
          ("host_us", "  of which host stat calls"),
          ("return_us", "return to user: registers left in kvm_run for the next KVM_RUN")]


def breakdown_markdown(b: dict[str, dict[str, float]]) -> str:
    names = list(b)
    rows = [[label, *[b[n].get(key, 0) for n in names]] for key, label in PHASES]
    rows.append(["guest-measured round trip", *[b[n]["guest_measured_us"] for n in names]])
    return "\nWhere one syscall's time goes (us per call, `Guest.set_profile`):\n\n" + \
        markdown_table(["phase", *names], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench syscalls", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small folders and few repetitions")
    p.add_argument("--json", default=None, help="default: bench/results/syscalls.json")
    args = p.parse_args(argv)
    started = time.perf_counter()
    res = measure(quick=args.quick)
    res["seconds"] = round(time.perf_counter() - started, 1)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "syscalls.json", "syscalls", res, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
