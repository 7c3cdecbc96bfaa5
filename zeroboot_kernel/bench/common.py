"""Shared helpers of the benchmarks: percentiles and result files."""
from __future__ import annotations

import json
import os
import platform
import time
from typing import Any


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (values in any order)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(pct / 100 * len(s) + 0.5)) - 1))
    return round(s[k], 4)


def write_results(path: str, results: dict[str, Any], table: str) -> None:
    """Write results as JSON (with machine facts) and the markdown table next to it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    doc = {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "kernel": platform.release()},
           **results}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(table + "\n")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
