"""`python -m zeroboot_kernel.bench memory`: data-heavy notebooks (issue 23), next to stock ipykernel.

Scenarios, each run through jupyter_client on the zeroboot kernel (chained mode, default checkpoint
budget) and on stock ipykernel (`python3`), one kernel after the other:
  arrays     10 cells of `a = np.random.rand(25_000_000); b = a * i` (two 200 MB arrays that
             replace the previous cell's)
  dataframe  a DataFrame built, then transformed over 20 cells (`df = df * 1.01 + i`)
Per cell: the round trip (request -> reply + idle) and the host memory the kernel uses: the drop of
the host's MemAvailable since just before the kernel started (processes and kernel memory, KVM's
included), sampled after the cell once the zeroboot engine has taken the next cell's checkpoint,
and the PSS of the kernel's process tree. After the dataframe scenario the zeroboot kernel reports
how deep %rewind can go within its budget (and how many of those checkpoints are on disk, spilled
by checkpoint_spill.py) and tries `%rewind 5`.
Then, in-process: `np.ones` fills in a guest vs on the host (the 2 GiB fill needs a template with
3 GiB of guest memory, built once under the name `bench-memory`), in the guest also without its
unlogged window (one dirty-logged memslot, as before issue 23's window), `np.ones(10_000_000) + 1.0`
first and repeated, and the raw speed of the cache folder (write and read-back, O_DIRECT) next to
what the session's spills cost.
The host is shared (other processes change MemAvailable too): read the memory columns as +-50 MB.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..engine_server import IDLE_RELEASE_S
from . import common

OURS, STOCK = "zeroboot", "python3"
# the zeroboot kernel once more, dropping what the spill writer cannot write at once instead of
# waiting for it up to its bound (checkpoint_spill.wait_from_env): what the default's wait costs
OURS_DROP = "zeroboot, drop behind"
KERNELS = {STOCK: (STOCK, {}), OURS: (OURS, {}), OURS_DROP: (OURS, {"ZEROBOOT_CHECKPOINT_SPILL_BEHIND": "drop"})}
MIB = 1 << 20


def _scenarios(quick: bool) -> dict[str, dict[str, Any]]:
    if quick:  # CI's smoke run: same shapes, a few cells, a sliver of the data
        return {"arrays": {"setup": "import numpy as np", "cells": [f"a = np.random.rand(1_000_000); b = a * {i}"
                                                                      for i in range(1, 5)], "data_mb": 16},
                "dataframe": {"setup": _df_setup(100_000), "cells": [f"df = df * 1.01 + {i}" for i in range(1, 5)],
                              "data_mb": 8}}
    return {"arrays": {"setup": "import numpy as np", "cells": [f"a = np.random.rand(25_000_000); b = a * {i}"
                                                              for i in range(1, 11)], "data_mb": 400},
            # 200 MB, not the 1 GB: the default template has 1 GiB of guest memory, and a
            # transform holds three frames at once (the old one, df * 1.01, and the result)
            "dataframe": {"setup": _df_setup(2_500_000), "cells": [f"df = df * 1.01 + {i}" for i in range(1, 21)],
                          "data_mb": 200}}


def _df_setup(rows: int) -> str:
    return ("import numpy as np, pandas as pd\n"
            f"df = pd.DataFrame(np.random.default_rng(0).random(({rows}, 10)), columns=list('abcdefghij'))")


# ---- a kernel, and what it costs the host ----

def _tree_pss_kb(pid: int) -> int:
    """PSS of a process and its descendants (KiB): the zeroboot engine is a child of its kernel.
    Checkpoint stores are counted whole, from their memfds (common.checkpoint_store_kb), not by
    the pages of them a process has mapped."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    return sum(common.pss_without_stores_kb(p.pid) + common.checkpoint_store_kb(p.pid) for p in procs)


def _cell(k: Any, code: str) -> tuple[float, str, str]:
    """Run one cell; (seconds, status, all text it printed)."""
    texts: list[str] = []
    t0 = time.perf_counter()
    msg_id = k.kc.execute(code, store_history=True)
    deadline = time.monotonic() + k.timeout
    status = k._wait(k.kc.get_shell_msg, msg_id, deadline, lambda m: True)["content"]["status"]

    def idle(m: dict[str, Any]) -> bool:
        if m["msg_type"] == "stream":
            texts.append(m["content"]["text"])
        elif m["msg_type"] == "error":
            texts.append(m["content"]["evalue"])
        return m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"

    k._wait(k.kc.get_iopub_msg, msg_id, deadline, idle)
    return time.perf_counter() - t0, status, "".join(texts)


def _settle(k: Any) -> float:
    """Let the engine finish what it does after a reply (the next cell's checkpoint) before memory
    is sampled: a magic-only cell is answered by the engine only after that work is done. Returns
    how long that took (seconds): what a next cell sent at once (Run All) would wait for."""
    if k.name != OURS:
        return 0.0
    return _cell(k, "%sandbox checkpoints")[0]


def run_scenario(kernel_name: str, scenario: dict[str, Any], timeout: float, rewind: bool,
                 env: dict[str, str] | None = None, idle_s: float = 0.0) -> dict[str, Any]:
    """idle_s: after the cells, wait this long without a request and sample the memory again (the
    zeroboot engine's idle release, engine_server.IDLE_RELEASE_S)."""
    from .kernel import BenchKernel

    base = common.mem_available_kb()
    k = BenchKernel(kernel_name, timeout, env)
    try:
        # jupyter_client's LocalProvisioner has the kernel's pid; the base class does not declare it
        pid = k.km.provisioner.pid if k.km.provisioner else 0  # type: ignore[attr-defined]
        _cell(k, scenario["setup"])
        _settle(k)
        start_kb = base - common.mem_available_kb()
        cells = []
        for code in scenario["cells"]:
            secs, status, text = _cell(k, code)
            if status != "ok":
                raise RuntimeError(f"{kernel_name}: {code!r} failed: {text[-500:]}")
            settle = _settle(k)
            cells.append({"ms": round(secs * 1e3, 1), "with_checkpoint_ms": round((secs + settle) * 1e3, 1),
                          "host_mb": round((base - common.mem_available_kb()) / 1024, 1),
                          "pss_mb": round(_tree_pss_kb(pid) / 1024, 1)})
        res: dict[str, Any] = {"cells": cells, "after_setup_host_mb": round(start_kb / 1024, 1)}
        if idle_s:
            time.sleep(idle_s)
            res["idle"] = {"seconds": idle_s, "pss_mb": round(_tree_pss_kb(pid) / 1024, 1),
                           "host_mb": round((base - common.mem_available_kb()) / 1024, 1)}
        if rewind and kernel_name == OURS:
            _, _, listing = _cell(k, "%sandbox checkpoints")
            m = re.search(r"%rewind can go back (\d+) cell", listing)
            res["rewind_depth"] = int(m.group(1)) if m else None
            res["checkpoints_text"] = listing.strip().splitlines()[:4]
            m = re.search(r"(\d+) in memory, (\d+) on disk", listing)
            res["in_memory"], res["on_disk"] = (int(m.group(1)), int(m.group(2))) if m else (None, None)
            m = re.search(r"(\d+) dropped while the disk writer was busy", listing)
            res["gaps"] = int(m.group(1)) if m else 0
            secs, status, text = _cell(k, "%rewind 5")
            res["rewind_5"] = {"ok": status == "ok", "ms": round(secs * 1e3, 1), "text": text.strip()[:300]}
    finally:
        k.close()
    steady = cells[len(cells) // 2:]  # the second half: the checkpoints have reached their budget
    res["peak_host_mb"] = max(c["host_mb"] for c in cells)
    res["last_cell_ms"] = cells[-1]["ms"]
    res["median_cell_ms"] = round(sorted(c["ms"] for c in steady)[len(steady) // 2], 1)
    res["median_host_mb"] = round(sorted(c["host_mb"] for c in steady)[len(steady) // 2], 1)
    res["median_with_checkpoint_ms"] = round(sorted(c["with_checkpoint_ms"] for c in steady)[len(steady) // 2], 1)
    res["median_pss_mb"] = round(sorted(c["pss_mb"] for c in steady)[len(steady) // 2], 1)
    res["peak_pss_mb"] = max(c["pss_mb"] for c in cells)
    return res


# ---- in-process: fills, and the cost of a spill to disk ----

FILL_CODE = """
import numpy as np, time
def best(f, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); out.append(time.perf_counter() - t0)
    return out
fill = best(lambda: np.ones({n}), 2)
small = best(lambda: np.ones(10_000_000) + 1.0, 5)
print({{"fill_first_s": fill[0], "fill_s": min(fill), "ones_plus_first_s": small[0], "ones_plus_s": min(small[1:])}})
"""


def fills(fill_bytes: int) -> dict[str, Any]:
    """np.ones of fill_bytes and np.ones(10_000_000) + 1.0, in a guest and on the host; in the guest
    also without its unlogged window (one dirty-logged memslot: KVM maps 4 KiB pages)."""
    import ast

    from ..native import unlogged_window
    from ..template import Template, TemplateConfig, default_preload
    from .kernel import _thread_env

    code = FILL_CODE.format(n=fill_bytes // 8)
    memory = max(1 << 30, (fill_bytes + (768 << 20) + (1 << 30) - 1) & ~((1 << 30) - 1))  # + interpreter
    config = (TemplateConfig(preload=default_preload()) if memory <= 1 << 30
              else TemplateConfig("bench-memory", default_preload(), memory))
    template = Template.ensure(config)
    with template.fork() as sb:
        r = sb.execute(code)
        guest = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    was = unlogged_window(False)   # the same in one dirty-logged memslot, as before the window
    try:
        with template.fork() as sb:
            r = sb.execute(code)
            logged = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    finally:
        unlogged_window(was)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **_thread_env()})
    host = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    gib = fill_bytes / (1 << 30)
    return {"fill_gib": round(gib, 3), "guest_memory_gib": memory >> 30,
            "guest": {k: round(v * 1e3, 1) for k, v in guest.items()},
            "guest_without_window": {k: round(v * 1e3, 1) for k, v in logged.items()},
            "host": {k: round(v * 1e3, 1) for k, v in host.items()},
            "fill_speed_vs_host": round(host["fill_s"] / guest["fill_s"], 2),
            "fill_first_speed_vs_host": round(host["fill_first_s"] / guest["fill_first_s"], 2),
            "fill_speed_vs_host_without_window": round(host["fill_s"] / logged["fill_s"], 2),
            "ones_plus_speed_vs_host": round(host["ones_plus_s"] / guest["ones_plus_s"], 2)}


def spill_probe(size_mb: int) -> dict[str, Any]:
    """The raw speed of the cache folder's disk (O_DIRECT write, cold read back), to read the
    sessions' spill timings against (docs/PERFORMANCE.md)."""
    import mmap

    from ..template import cache_root

    folder = cache_root()
    folder.mkdir(parents=True, exist_ok=True)
    size = size_mb * MIB
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    block = os.urandom(MIB)
    for off in range(0, size, MIB):
        buf[off:off + MIB] = block
    flags = os.O_TMPFILE | os.O_RDWR | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(folder, flags, 0o600)
    except OSError:  # no O_DIRECT on this file system
        fd = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        view = memoryview(buf)
        t0 = time.perf_counter()
        for off in range(0, size, 8 * MIB):
            os.pwrite(fd, view[off:off + 8 * MIB], off)
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        back = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE)
        total = sum(back[off] for off in range(0, size, 4096))
        read_s = time.perf_counter() - t0
        back.close()
        del view
    finally:
        os.close(fd)
        buf.close()
    return {"size_mb": size_mb, "folder": str(folder), "write_mb_s": round(size_mb / write_s, 1),
            "read_mb_s": round(size_mb / read_s, 1), "checksum": total % 256,
            "spill_400mb_ms": round(400 / (size_mb / write_s) * 1e3), "rewind_400mb_ms": round(400 / (size_mb / read_s) * 1e3)}


def measure(quick: bool = False, timeout: float = 600.0) -> dict[str, Any]:
    from .kernel import _ensure_our_kernelspec

    _ensure_our_kernelspec()
    res: dict[str, Any] = {"quick": quick, "scenarios": {}}
    for name, scenario in _scenarios(quick).items():
        row: dict[str, Any] = {"setup": scenario["setup"], "cell": scenario["cells"][-1], "cells": len(scenario["cells"]),
                               "data_mb": scenario["data_mb"]}
        # the quick sizes never spill: the waiting variant would measure the same as OURS
        for label in (STOCK, OURS) if quick else (STOCK, OURS, OURS_DROP):
            kernel_name, env = KERNELS[label]
            idle_s = 0.0 if quick else IDLE_RELEASE_S + 5.0  # ipykernel too: the same wait, for its own sample
            row[label] = run_scenario(kernel_name, scenario, timeout, rewind=name == "dataframe", env=env,
                                      idle_s=idle_s if label in (STOCK, OURS) else 0.0)
        row.update(_ratios(row[OURS], row[STOCK]))
        if "idle" in row[OURS]:
            row["idle_pss_ratio"] = round(row[OURS]["idle"]["pss_mb"] / max(row[STOCK]["idle"]["pss_mb"], 1.0), 2)
        if OURS_DROP in row:
            row["drop_behind"] = _ratios(row[OURS_DROP], row[STOCK])
        res["scenarios"][name] = row
    res["fill"] = fills((64 << 20) if quick else (2 << 30))
    res["spill"] = spill_probe(16 if quick else 400)
    return res


def _ratios(ours: dict[str, Any], stock: dict[str, Any]) -> dict[str, float]:
    return {"memory_ratio": round(ours["median_host_mb"] / max(stock["median_host_mb"], 1.0), 2),
            "pss_ratio": round(ours["median_pss_mb"] / max(stock["median_pss_mb"], 1.0), 2),
            "time_ratio": round(ours["median_cell_ms"] / max(stock["median_cell_ms"], 0.1), 2),
            "time_with_checkpoint_ratio": round(ours["median_with_checkpoint_ms"]
                                                / max(stock["median_with_checkpoint_ms"], 0.1), 2)}


WHERE_IT_GOES = """\
Where zeroboot's extra memory and time go (docs/ARCHITECTURE.md, sections 2, 4 and 5):
* the checkpoint the next cell rolls back to holds a copy of every page the notebook changed since
  the template (a crash must be undone), and the default budget (as much as the notebook's data)
  keeps older checkpoints in memory only while they fit next to it; older ones are spilled to a
  per-session file on disk (only the pages that differ from the template; disk budget
  ZEROBOOT_CHECKPOINT_DISK) and `%rewind` reads them back; `%sandbox checkpoints budget 4G` keeps
  more in memory;
* freed arrays and frames stay mapped for reuse (up to half of guest memory) so that the next
  ones are filled at memset speed, until the session has been idle for 30 s (the idle release
  gives them back; the next cell's big allocations then get fresh pages), and the engine is a
  second Python process;
* the checkpoint's copy is taken after the reply (cell ms leaves it out); it is written into the
  store pages of the checkpoints the budget drops just before it (about a third of the cost of
  fresh pages here), with pwrite in 1 MiB runs where it needs fresh ones;
* big mappings (>= 4 MiB) live in the unlogged window, a memslot without dirty logging backed by
  huge pages: a fresh array costs one KVM fault per 2 MiB instead of one per 4 KiB (the "without
  window" row: one dirty-logged memslot). The price: each checkpoint compares every populated page
  of the window with the last checkpoint (KVM cannot say which were written), ~0.5 s per GiB kept
  unchanged; a host with fragmented memory may also make the first huge-page fill wait for
  compaction;
* a spill is written by a writer thread while the next cells run, its page contents with O_DIRECT
  (past the page cache); what is in flight stays in memory until written, so it is bounded (half
  the budget), and a checkpoint that must leave memory beyond that bound waits for the writer up
  to 2 s, then is dropped (a gap for `%rewind`); the "drop behind" rows
  (ZEROBOOT_CHECKPOINT_SPILL_BEHIND=drop) never wait and show what the wait costs a Run All;
* not built, because the measurements say it does not pay here: sharing pages between the live
  sandbox and its checkpoint (the guest then re-faults what it touches next: -570 MB but 4x slower
  cells for the arrays).
"""


def markdown(res: dict[str, Any]) -> str:
    rows = []
    for name, row in res["scenarios"].items():
        for label in (OURS, OURS_DROP, STOCK):
            if label not in row:
                continue
            r = row[label]
            rows.append([f"{name} ({row['cells']} cells, {row['data_mb']} MB)", label, r["median_cell_ms"],
                         r["median_with_checkpoint_ms"], r["last_cell_ms"], r["median_pss_mb"], r["peak_pss_mb"],
                         r["median_host_mb"]])
        for label, q in ((OURS, row), (OURS_DROP, row.get("drop_behind"))):
            if q:
                rows.append(["", f"ratio ({label})", f"{q['time_ratio']}x", f"{q['time_with_checkpoint_ratio']}x", "",
                             f"{q['pss_ratio']}x", "", f"{q['memory_ratio']}x"])
    table = common.markdown_table(["scenario", "kernel", "cell ms", "cell + checkpoint ms", "last cell ms",
                                   "PSS MB", "PSS MB (peak)", "MemAvailable drop MB"], rows)
    df = res["scenarios"].get("dataframe", {}).get(OURS, {})
    rw = df.get("rewind_5") or {}
    dw = res["scenarios"].get("dataframe", {}).get(OURS_DROP, {})
    rww = dw.get("rewind_5") or {}
    drop_text = (f" Dropping behind, `%rewind` could go back {dw.get('rewind_depth')} cell(s) ({dw.get('in_memory')} "
                 f"in memory, {dw.get('on_disk')} on disk, {dw.get('gaps', 0)} dropped) and `%rewind 5` "
                 f"{'worked' if rww.get('ok') else 'was refused'} ({rww.get('ms')} ms)." if dw else "")
    idle = [f"{name} {row[OURS]['idle']['pss_mb']:,.0f} MB against ipykernel's {row[STOCK]['idle']['pss_mb']:,.0f} MB "
            f"({row['idle_pss_ratio']}x)" for name, row in res["scenarios"].items() if "idle" in row.get(OURS, {})]
    idle_text = (f" PSS after {res['scenarios']['arrays'][OURS]['idle']['seconds']:.0f} s without a request (the engine's "
                 f"idle release has given back the freed memory kept for reuse and the pages back at the template's "
                 f"bytes): {'; '.join(idle)}." if idle else "")
    f, s = res["fill"], res["spill"]
    g, h = f["guest"], f["host"]
    fill_rows = [[f"np.ones fill of {f['fill_gib']:g} GiB, first / best of 2", f"{g['fill_first_s']:.0f} / {g['fill_s']:.0f}",
                  f"{h['fill_first_s']:.0f} / {h['fill_s']:.0f}", f"{f['fill_first_speed_vs_host']} / {f['fill_speed_vs_host']}"],
                 ["the same fill without the unlogged window",
                  f"{f['guest_without_window']['fill_first_s']:.0f} / {f['guest_without_window']['fill_s']:.0f}",
                  f"{h['fill_first_s']:.0f} / {h['fill_s']:.0f}", f"- / {f.get('fill_speed_vs_host_without_window')}"],
                 ["`np.ones(10_000_000) + 1.0`, first / best of the next 4", f"{g['ones_plus_first_s']:.1f} / {g['ones_plus_s']:.1f}",
                  f"{h['ones_plus_first_s']:.1f} / {h['ones_plus_s']:.1f}", f"- / {f['ones_plus_speed_vs_host']}"]]
    fill_table = common.markdown_table(["fill", "guest ms", "host ms", "speed vs host"], fill_rows)
    return (f"{table}\nMedians over the second half of the cells (the checkpoints have reached their budget). "
            f"Cell ms: request -> reply + idle; cell + checkpoint: until the zeroboot engine has also taken the next "
            f"cell's checkpoint (what Run All waits for). PSS: the kernel's process tree (the zeroboot engine and its "
            f"checkpoint stores included), after each cell; MemAvailable drop: since just before the kernel started "
            f"(kernel memory included, but other processes on this shared host move it too). Zeroboot runs with the "
            f"default checkpoint budget. After the dataframe cells, `%rewind` could go back {df.get('rewind_depth')} cell(s); "
            f"({df.get('in_memory')} in memory, {df.get('on_disk')} on disk, {df.get('gaps', 0)} dropped while the disk "
            f"writer was busy); `%rewind 5` {'worked' if rw.get('ok') else 'was refused'} ({rw.get('ms')} ms: "
            f"{rw.get('text', '')[:160]}).{drop_text}{idle_text}\n\n"
            f"{fill_table}\nGuest memory for the fill: {f['guest_memory_gib']} GiB. The cache folder's disk "
            f"(probe of {s['size_mb']} MB, O_DIRECT): writes at {s['write_mb_s']} MB/s and reads "
            f"back at {s['read_mb_s']} MB/s (~{s['spill_400mb_ms']} ms / ~{s['rewind_400mb_ms']} ms for 400 MB at "
            f"that speed; spills write their page contents O_DIRECT).\n\n{WHERE_IT_GOES}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI-sized scenarios (a fraction of the data)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one kernel start or cell")
    p.add_argument("--json", type=Path, default=common.results_dir() / "memory.json")
    args = p.parse_args(argv)
    res = measure(args.quick, args.timeout)
    text = markdown(res)
    common.write_results(args.json, "memory", res, text)
    print(text)
    print(json.dumps({k: v for k, v in res.items() if k != "scenarios"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
