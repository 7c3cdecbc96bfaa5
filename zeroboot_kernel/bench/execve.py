"""`python -m zeroboot_kernel.bench execve`: execve of /bin/true in the guest vs process creation on
the host (issue 15), in one run.

What is measured in the guest is exec alone (fork+wait is `bench processes`): a fork of the template runs a cell that reads the clock and calls os.execv("/bin/true"), and the
time runs until the engine reports the exit (execve, ld.so, libc's start-up, exit_group). The
guest's clock is the host's (the vDSO page), so both ends are on one clock. On the host a process
cannot exec without being created, so the host rows are fork+exec+wait and posix_spawn+wait of
/bin/true: they include process creation, which the guest row does not. Two more guest rows give
the scale of the image being replaced: /bin/true booted in a new sandbox (no exec), and `sh -c
'exec /bin/true'` booted the same way (sh's start-up plus an execve from a small image, where the
first row's execve first gives back the ~300 MB the Python agent had mapped).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from ..errors import SandboxCrashed
from ..guest_view import IDENTITY_FILES, GuestSpec, system_view
from ..native import EventKind, Guest
from ..template import Template
from .common import markdown_table, results_dir, write_results

TRUE = "/bin/true"
CELL = ("import os, sys, time\nsys.stdout.write(f'T0 {time.monotonic_ns()}\\n'); sys.stdout.flush()\n"
        f"os.execv({TRUE!r}, ['true'])")


def _guest_once(template: Template) -> float:
    """ms from just before the guest's execve to its exit, seen on the host."""
    out: list[str] = []
    with template.fork() as sb:
        try:
            sb.execute(CELL, on_stream=lambda name, text: out.append(text))
        except SandboxCrashed as ended:
            t1 = time.monotonic_ns()
            if "exited with status 0" not in str(ended):
                raise
        else:
            raise RuntimeError("the cell returned: execve did not replace the agent")
    t0 = int("".join(out).split("T0 ")[1].split()[0])
    return (t1 - t0) / 1e6


def _boot_once(argv: list[str]) -> float:
    """ms from creating a sandbox running argv to its exit."""
    spec = GuestSpec(exe=argv[0], argv=argv, env={"PATH": "/usr/bin:/bin"}, view=[*system_view(), "/etc/ld.so.cache"],
                     mem_bytes=256 << 20, files=dict(IDENTITY_FILES))
    t0 = time.perf_counter_ns()
    with Guest.boot(spec) as guest:
        while True:
            ev = guest.run(time.monotonic() + 30)
            if ev.kind is EventKind.EXIT and ev.status == 0:
                break
            if ev.kind is not EventKind.OUTPUT:
                raise RuntimeError(f"{argv}: {ev.kind.name} {ev.message}")
    return (time.perf_counter_ns() - t0) / 1e6


def _host_fork_exec() -> float:
    t0 = time.perf_counter_ns()
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(TRUE, ["true"])
        finally:
            os._exit(127)
    os.waitpid(pid, 0)
    return (time.perf_counter_ns() - t0) / 1e6


def _host_spawn() -> float:
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(TRUE, ["true"], {})
    os.waitpid(pid, 0)
    return (time.perf_counter_ns() - t0) / 1e6


def _row(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_ms": round(statistics.median(s), 3), "min_ms": round(s[0], 3), "p90_ms": round(s[int(0.9 * (len(s) - 1))], 3)}


def measure(runs: int = 30) -> dict[str, Any]:
    template = Template.ensure()
    _guest_once(template)  # warm: the fork's first run faults in the agent's pages
    guest = [_guest_once(template) for _ in range(runs)]
    fork_exec = [_host_fork_exec() for _ in range(runs)]
    spawn = [_host_spawn() for _ in range(runs)]
    booted = [_boot_once([TRUE]) for _ in range(runs)]
    via_sh = [_boot_once(["/bin/sh", "-c", f"exec {TRUE}"]) for _ in range(runs)]
    return {"runs": runs, "program": TRUE, "rows": {
        "guest: execve to exit, from the Python agent (no process creation)": _row(guest),
        "guest: a new sandbox running it (no exec)": _row(booted),
        "guest: a new sandbox running sh -c 'exec it'": _row(via_sh),
        "host: fork + execve + wait": _row(fork_exec),
        "host: posix_spawn + wait": _row(spawn),
    }}


def markdown(res: dict[str, Any]) -> str:
    rows = [[label, v["p50_ms"], v["min_ms"], v["p90_ms"]] for label, v in res["rows"].items()]
    return markdown_table([f"{res['program']} ({res['runs']} runs)", "p50 ms", "min ms", "p90 ms"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench execve", description=__doc__)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--json", default=None, help="default: bench/results/execve.json")
    args = p.parse_args(argv)
    res = measure(args.runs)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "execve.json", "execve", res, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
