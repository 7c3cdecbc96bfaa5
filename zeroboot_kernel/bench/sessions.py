"""`python -m zeroboot_kernel.bench sessions`: host memory per live notebook session, next to stock
ipykernel in the same run, and where a session's memory goes (issue 18).

Sessions: N live kernels of each kind at once (through jupyter_client), each after the hub bench's
six cells (numpy, pandas, a matplotlib plot, prints: bench/hub.py's CELLS) and a pause of
--idle seconds (a person between two cells). Kinds, one after the other:
  python3              stock ipykernel
  zeroboot-no-release  the zeroboot kernel with ZEROBOOT_IDLE_RELEASE=0 (the engine keeps the
                       private copies of pages that hold the template's bytes again: as before)
  zeroboot             the zeroboot kernel as shipped, but with ZEROBOOT_IDLE_RELEASE=1 (the
                       default, 30 s, would make the bench wait): its idle session as a class's are
Per kind: the drop of the host's MemAvailable per session (processes and kernel memory, KVM's
included; other processes on this shared host move it too) and, per process of a session, where
its memory goes (/proc/PID/smaps and /proc/PID/pagemap): the Python heap and other anonymous memory,
libraries, the guest's private pages (its copies of template pages and its anonymous memory), the
template's page cache (shared by every session of that template), the checkpoint stores (memfds).

Live forks: in this process, --forks forks of the template that each ran `x = 1`, then each gives
back its unchanged pages (what the engine does when a session is idle): USS of this process and
the MemAvailable drop per fork, before and after.
"""
from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from . import common
from .hub import CELLS
from .kernel import OURS, STOCK, BenchKernel, _ensure_our_kernelspec

NO_RELEASE = "zeroboot-no-release"
KIB = 1024
PM_PRESENT, PM_FILE_OR_SHARED = 1 << 63, 1 << 61  # /proc/PID/pagemap entry bits


def _vmas(pid: int) -> list[dict[str, Any]]:
    vmas: list[dict[str, Any]] = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if not parts[0].endswith(":") and "-" in parts[0]:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                vmas.append({"start": start, "end": end, "name": parts[5] if len(parts) > 5 else "",
                             "Rss": 0, "Pss": 0, "Private_Dirty": 0, "Private_Clean": 0})
            elif vmas and parts[0].rstrip(":") in ("Rss", "Pss", "Private_Dirty", "Private_Clean"):
                vmas[-1][parts[0].rstrip(":")] += int(parts[1])
    return vmas


def _private_copies_kb(pid: int, start: int, end: int) -> int:
    """KiB of [start, end) that are private copies (present, not a file page): a file mapping's
    pages the process wrote. Private_Dirty cannot say it: a template just built is dirty page cache."""
    n = (end - start) // 4096
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek(start // 4096 * 8)
        data = f.read(n * 8)
    count = 0
    for i in range(0, len(data), 8):
        e = int.from_bytes(data[i:i + 8], "little")
        if e & PM_PRESENT and not e & PM_FILE_OR_SHARED:
            count += 1
    return count * 4


def breakdown(pid: int) -> dict[str, int]:
    """Where one process's memory goes (KiB). The guest's memory is the span of the template
    image's mappings (a fork maps the image at the guest's own offsets, and anonymous or store
    memory over the ranges it freed or restored)."""
    vmas = _vmas(pid)
    image = [v for v in vmas if v["name"].endswith("memory.img")]
    lo = min((v["start"] for v in image), default=0)
    hi = max((v["end"] for v in image), default=0)
    out = {"heap_anon_kb": 0, "libraries_private_kb": 0, "libraries_shared_pss_kb": 0, "guest_private_kb": 0,
           "template_cache_pss_kb": 0, "checkpoint_stores_kb": common.checkpoint_store_kb(pid)}
    for v in vmas:
        private = v["Private_Dirty"] + v["Private_Clean"]
        if v["name"].endswith("memory.img"):
            copies = _private_copies_kb(pid, v["start"], v["end"])
            out["guest_private_kb"] += copies
            out["template_cache_pss_kb"] += max(v["Pss"] - copies, 0)
        elif lo <= v["start"] < hi:  # anonymous memory or a store run inside the guest
            out["guest_private_kb"] += v["Rss"] if not v["name"] else v["Private_Dirty"]
        elif "zeroboot-snapshot" in v["name"]:
            continue  # counted from the memfds themselves (pages written by pwrite are not mapped)
        elif not v["name"] or v["name"].startswith("["):
            out["heap_anon_kb"] += private
        else:
            out["libraries_private_kb"] += private
            out["libraries_shared_pss_kb"] += max(v["Pss"] - private, 0)
    return out


def _tree(pid: int) -> list[tuple[str, int]]:
    import psutil

    root = psutil.Process(pid)
    out = []
    for p in [root, *root.children(recursive=True)]:
        cmd = " ".join(p.cmdline())
        out.append(("engine" if "engine_server" in cmd else "kernel", p.pid))
    return out


def _run_cells(k: BenchKernel) -> None:
    from .memory import _cell

    for code, expect in CELLS:
        _, status, text = _cell(k, code)
        if status != "ok":
            raise RuntimeError(f"{k.name}: {code!r} failed: {text[-300:]}")


def run_kind(kind: str, sessions: int, idle: float, timeout: float) -> dict[str, Any]:
    name = STOCK if kind == STOCK else OURS
    env = {"ZEROBOOT_IDLE_RELEASE": "0" if kind == NO_RELEASE else "1"} if kind != STOCK else {}
    gc.collect()
    base = common.mem_available_kb()
    kernels: list[BenchKernel] = []
    try:
        for _ in range(sessions):
            k = BenchKernel(name, timeout, env=env)
            kernels.append(k)
            _run_cells(k)
        time.sleep(idle)
        per_session = (base - common.mem_available_kb()) / sessions
        parts: dict[str, dict[str, float]] = {}
        for k in kernels:
            pid = k.km.provisioner.pid if k.km.provisioner else 0  # type: ignore[attr-defined]
            for role, p in _tree(pid):
                for key, kb in breakdown(p).items():
                    parts.setdefault(role, {}).setdefault(key, 0.0)
                    parts[role][key] += kb / sessions
    finally:
        for k in kernels:
            k.close()
    return {"host_kb_per_session": round(per_session, 1),
            "parts_kb": {role: {key: round(v, 1) for key, v in d.items()} for role, d in parts.items()}}


def live_forks(n: int, code: str = "x = 1") -> dict[str, Any]:
    """n forks of the template that each ran `code`, before and after they give back their
    unchanged pages (Guest.release_template_copies, what the engine does for an idle session)."""
    from ..template import Template

    template = Template.ensure()
    warm = template.fork()  # the engine's first-fork bookkeeping and the template's page cache
    warm.execute(code)
    warm.close()
    template.snapshot.engine.release_parked()  # memory per new fork: none starts on the warm one's memory
    gc.collect()
    before = common.memory_sample()
    sandboxes = [template.fork() for _ in range(n)]
    try:
        for sb in sandboxes:
            sb.execute(code)
        after_cell = common.per_fork_kb(before, common.memory_sample(), n)
        t0 = time.perf_counter()
        released = sum(sb.guest.release_template_copies() for sb in sandboxes)
        release_ms = (time.perf_counter() - t0) * 1e3 / n
        after_release = common.per_fork_kb(before, common.memory_sample(), n)
    finally:
        for sb in sandboxes:
            sb.close()
    return {"forks": n, "code": code, "after_cell_kb": after_cell, "after_release_kb": after_release,
            "released_kb_per_fork": round(released * 4 / n, 1), "release_ms_per_fork": round(release_ms, 2)}


def measure(sessions: int = 4, forks: int = 500, idle: float = 3.0, timeout: float = 600.0) -> dict[str, Any]:
    _ensure_our_kernelspec()
    res: dict[str, Any] = {"sessions": sessions, "idle_s": idle, "cells": [c for c, _ in CELLS], "kinds": {}}
    for kind in (STOCK, NO_RELEASE, OURS):
        res["kinds"][kind] = run_kind(kind, sessions, idle, timeout)
    stock = res["kinds"][STOCK]["host_kb_per_session"]
    for kind in (NO_RELEASE, OURS):
        res["kinds"][kind]["host_ratio_vs_ipykernel"] = round(res["kinds"][kind]["host_kb_per_session"] / max(stock, 1.0), 2)
    res["live_forks"] = live_forks(forks)
    return res


ROWS = (("kernel", "heap_anon_kb", "kernel process: Python heap and anonymous memory"),
        ("kernel", "libraries_private_kb", "kernel process: libraries, private"),
        ("kernel", "libraries_shared_pss_kb", "kernel process: libraries, shared (PSS)"),
        ("engine", "heap_anon_kb", "engine process: Python heap, cffi, engine bookkeeping"),
        ("engine", "libraries_private_kb", "engine process: libraries, private"),
        ("engine", "libraries_shared_pss_kb", "engine process: libraries, shared (PSS)"),
        ("engine", "guest_private_kb", "guest: private pages (its copies of template pages, its anonymous memory)"),
        ("engine", "checkpoint_stores_kb", "checkpoints: page stores"),
        ("engine", "template_cache_pss_kb", "template's page cache (PSS; shared by every session of the template)"))


def markdown(res: dict[str, Any]) -> str:
    kinds = res["kinds"]
    order = (OURS, NO_RELEASE, STOCK)
    rows = []
    for role, key, label in ROWS:
        vals = [kinds[k]["parts_kb"].get(role, {}).get(key) for k in order]
        if all(v is None for v in vals):
            continue
        rows.append([label, *("-" if v is None else round(v / KIB, 1) for v in vals)])
    rows.append(["**MemAvailable drop per session**", *(round(kinds[k]["host_kb_per_session"] / KIB, 1) for k in order)])
    rows.append(["ratio to ipykernel", f"{kinds[OURS]['host_ratio_vs_ipykernel']}x",
                 f"{kinds[NO_RELEASE]['host_ratio_vs_ipykernel']}x", "1x"])
    table = common.markdown_table(["where a session's memory goes (MiB per session)", "zeroboot",
                                   "zeroboot, no idle release", "ipykernel"], rows)
    f = res["live_forks"]
    fork_rows = [["after the cell", f["after_cell_kb"]["uss"], f["after_cell_kb"]["host"]],
                 ["after giving back unchanged pages", f["after_release_kb"]["uss"], f["after_release_kb"]["host"]]]
    fork_table = common.markdown_table([f"{f['forks']} live forks after `{f['code']}`", "USS KiB/fork",
                                        "MemAvailable drop KiB/fork"], fork_rows)
    return (f"{table}\n{res['sessions']} live sessions per kind at once, each after the hub's {len(res['cells'])} cells "
            f"(numpy, pandas, a matplotlib plot, prints) and {res['idle_s']:g} s idle. Parts: /proc/PID/smaps and "
            f"pagemap of each session's processes (ipykernel: one process, listed in the kernel rows). MemAvailable "
            f"moves with the other processes of this shared host too: read it as +-20 MiB.\n\n{fork_table}\n"
            f"Giving back took {f['release_ms_per_fork']} ms per fork ({f['released_kb_per_fork']} KiB each).\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench sessions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 sessions per kind and 50 forks (CI's smoke run)")
    p.add_argument("--sessions", type=int, default=4, help="live sessions per kind at once")
    p.add_argument("--forks", type=int, default=500, help="live forks for the `x = 1` measurement")
    p.add_argument("--idle", type=float, default=3.0, help="seconds idle after the cells, before measuring")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one kernel start or cell")
    p.add_argument("--json", type=Path, default=common.results_dir() / "sessions.json")
    args = p.parse_args(argv)
    sessions, forks = (2, 50) if args.quick else (args.sessions, args.forks)
    res = measure(sessions, forks, args.idle, args.timeout)
    text = markdown(res)
    common.write_results(args.json, "sessions", res, text)
    print(text)
    print(json.dumps(res["live_forks"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
