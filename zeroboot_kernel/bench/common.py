"""Shared pieces of the benchmarks: timing, statistics, where results go and how they look."""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import zeroboot_kernel

PACKAGE_ROOT = Path(zeroboot_kernel.__file__).resolve().parent.parent

# Published numbers, not measured here (marked as such wherever they are shown).
PUBLISHED = {
    "zeroboot": {"fork_p50_ms": 0.79, "fork_p99_ms": 1.74, "fork_exec_ms": 8.0, "concurrent_1000_ms": 815,
                 "kb_per_fork": 265, "source": "zeroboot README (bare metal)"},
    "E2B": {"create_ms": 150, "source": "E2B documentation (sandbox start, ~150 ms)"},
}


def results_dir() -> Path:
    """bench/results/ of the source checkout (committed), else of the current directory."""
    base = PACKAGE_ROOT if (PACKAGE_ROOT / "pyproject.toml").exists() else Path.cwd()
    return base / "bench" / "results"


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """p50/p90/min/max/mean of samples (seconds), with the sample count."""
    xs = sorted(samples)
    if not xs:
        return {"n": 0}

    def pct(p: float) -> float:
        k = (len(xs) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"n": len(xs), "p50": pct(0.5), "p90": pct(0.9), "min": xs[0], "max": xs[-1],
            "mean": statistics.fmean(xs)}


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile, rounded for reports."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(pct / 100 * len(s) + 0.5)) - 1))
    return round(s[k], 4)


def time_command(cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 timeout: float = 300) -> tuple[float, subprocess.CompletedProcess]:
    """Wall time of one run of cmd (seconds); raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed, proc


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:  # /sys/module also lists built-in modules, and exists where /proc/modules does not
        info["kvm_modules"] = sorted(name for name in os.listdir("/sys/module") if name.startswith("kvm"))
    except OSError:
        pass
    return info


def write_results(path: Path, name: str, data: dict[str, Any], markdown: str) -> None:
    """Write data as JSON at path (with the date and machine) and the markdown next to it (.md)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine(), **data}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown)


def process_memory_kb() -> dict[str, int]:
    """USS (private pages), PSS (proportional share) and RSS of this process, in KiB."""
    fields = {"Private_Clean:": "uss", "Private_Dirty:": "uss", "Pss:": "pss", "Rss:": "rss"}
    out = {"uss": 0, "pss": 0, "rss": 0}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key = line.split(None, 1)[0]
            if key in fields:
                out[fields[key]] += int(line.split()[1])
    return out


STORE_NAME = "zeroboot-snapshot"  # the engine's checkpoint stores (memfds)


def checkpoint_store_kb(pid: int) -> int:
    """KiB the checkpoint stores of pid hold (their memfds' allocated blocks, each store once): their
    pages are written with pwrite, so a process's PSS sees only those it happens to have mapped."""
    seen: set[int] = set()
    total = 0
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return 0
    for name in names:
        try:
            if STORE_NAME not in os.readlink(f"{fd_dir}/{name}"):
                continue
            st = os.stat(f"{fd_dir}/{name}")
        except OSError:
            continue
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_blocks * 512 // 1024
    return total


def pss_without_stores_kb(pid: int) -> int:
    """PSS of pid (KiB) without its mappings of checkpoint stores (checkpoint_store_kb counts them)."""
    total, store = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line: its range, ..., name
                    store = STORE_NAME in line
                elif head == "Pss:" and not store:
                    total += int(line.split()[1])
    except OSError:
        return 0
    return total


def mem_available_kb() -> int:
    """MemAvailable of the host: also counts kernel memory (page tables, KVM's shadow pages)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def memory_sample() -> dict[str, int]:
    """This process's USS/PSS/RSS and the host's MemAvailable (KiB), to diff per fork."""
    return {**process_memory_kb(), "available": mem_available_kb()}


def per_fork_kb(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    """What each of n forks created between two memory samples costs (KiB): USS and PSS of this
    process (the engine runs in it), and the drop of the host's MemAvailable."""
    return {"uss": round((after["uss"] - before["uss"]) / n, 1), "pss": round((after["pss"] - before["pss"]) / n, 1),
            "host": round((before["available"] - after["available"]) / n, 1)}


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):  # 3 significant digits, without an exponent for big numbers
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
