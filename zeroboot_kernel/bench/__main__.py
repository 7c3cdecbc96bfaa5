"""Dispatch `python -m zeroboot_kernel.bench SUBCOMMAND [options]` to the subcommand's module."""
from __future__ import annotations

import importlib
import sys

# subcommand -> module of this package with `main(argv: list[str]) -> int`
SUBCOMMANDS = {
    "startup": "startup",  # `run -c pass` / `import numpy` vs host python; numpy matmul speed
    "engine": "engine",    # forks, fork+exec, restores, chained forks, many live forks, template build
    "files": "files",      # reading a 200 MB file of the notebook's folder, guest vs host
    "network": "network",  # downloading 200 MB (--quick: 16) from a local server through the egress policy, vs host
    "syscalls": "syscalls",  # getpid, stat, small reads, listdir/walk of big folders, many CSVs, vs host
    "kernel": "kernel",    # execute round trips through jupyter_client, vs stock ipykernel
    "load": "load",
    "hub": "hub",          # a JupyterHub class: N students' servers and notebooks at once, zeroboot vs ipykernel        # K kernels running small cells at once vs K ipykernels: latency, context switches
    "comms": "comms",      # widget round trips (a slider moved in the frontend), vs stock ipykernel
    "peers": "peers",      # the same cells in a fork, a subprocess, a bubblewrap sandbox
    "scaling": "scaling",  # forks and memory as live forks grow; cells/s with 1 and 2 workers
    "memory": "memory",    # data-heavy notebooks vs ipykernel: host memory, time per cell, big fills
    "sessions": "sessions",  # host memory per live notebook session and where it goes, vs ipykernel; live forks after x = 1
    "batch": "batch",      # many small notebooks: zeroboot-kernel execute vs papermill vs nbconvert
    "threads": "threads",  # thread create+join, GIL ping-pong, ThreadPoolExecutor, 1+1 with idle threads
    "processes": "processes",  # os.fork + os.waitpid, a fork + pipe round trip, Pool(2).map of 100 tasks, vs host
    "fanout": "fanout",    # a 50-value %%fanout sweep of a 10 ms cell vs a loop in one cell
    "save": "save",        # session save/resume of 100 MB of arrays vs pickling them on the host
    "execve": "execve",    # execve of /bin/true in the guest vs fork/posix_spawn+exec+wait on the host
    "soak": "soak",        # one kernel, thousands of mixed cells: memory, fds and failures over time
    "all": "suite",        # every section above but soak, and docs/PERFORMANCE.md with charts
    "report": "report",    # re-render docs/PERFORMANCE.md from bench/results/ without measuring
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        names = ", ".join(SUBCOMMANDS)
        print(f"usage: python -m zeroboot_kernel.bench {{{names}}} [options]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(f"{__package__}.{SUBCOMMANDS[argv[0]]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
