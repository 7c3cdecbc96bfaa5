"""Smoke test of the benchmark suite: `bench all --quick` runs end to end and writes every field,
the report and its charts. No timing is asserted (speed is the benchmarks' business, not the tests')."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from kernel_helpers import ensure_kernelspecs

from zeroboot_kernel.bench.batch import QUICK_NOTEBOOKS

# section -> fields its JSON must have (numbers unless said)
FIELDS = {
    "engine": ["fork_p50_ms", "fork_p99_ms", "fork_max_ms", "fork_first_batch_p50_ms", "fork_exec_p50_ms", "fork_exec_p99_ms",
               "fork_exec_parked_p50_ms", "fork_exec_parked_p99_ms", "fork_exec_loop_p50_ms", "first_touch_pages_loop",
               "restore_exec_p50_ms", "chained_fork_1mib_p50_ms", "chained_fork_64mib_p50_ms", "concurrent_s",
               "concurrent_forks", "idle_fork_uss_kb", "idle_fork_pss_kb", "unstarted_fork_uss_kb",
               "template_build_s", "exits_per_print_cell"],
}
PEER_CASES = ["empty sandbox", "1+1", "print 10 KB", "numpy matmul 512", "matplotlib PNG"]
KERNEL_CASES = ["1+1", "print", "matmul", "plot", "autoreload"]
HEADLINE = ["fork_p50_ms", "fork_p99_ms", "fork_first_batch_p50_ms", "vs_zeroboot_fork_p50", "vs_e2b_create", "fork_exec_p50_ms",
            "fork_exec_parked_p50_ms", "restore_exec_p50_ms", "isolated_cell_p50_ms", "vs_subprocess_cell", "vs_bubblewrap_cell",
            "kernel_1plus1_p50_ms", "ipykernel_1plus1_p50_ms", "kernel_vs_ipykernel_1plus1", "template_build_s",
            "batch_notebooks_per_s", "batch_vs_papermill", "batch_vs_nbconvert"]


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x >= 0


def test_bench_all_quick_writes_every_field_and_the_report(tmp_path):
    ensure_kernelspecs()  # the kernel section starts the zeroboot kernelspec (and uses the tests' template)
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "zeroboot_kernel", "bench", "all", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=1800, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = {name: json.loads((out / f"{name}.json").read_text())
           for name in ("all", "engine", "peers", "kernel", "scaling", "files", "syscalls", "startup", "memory", "batch")}
    for name, data in res.items():
        assert data["benchmark"] == name and data["machine"]["cpus"] >= 1
    for field in FIELDS["engine"]:
        assert positive(res["engine"][field]), field
    for case in PEER_CASES:
        row = res["peers"]["cases"][case]
        assert set(row) == {"zeroboot", "zeroboot new fork", "subprocess", "bubblewrap"}, row
        assert all(positive(row[side]["p50_ms"]) and positive(row[side]["p99_ms"]) for side in row)
        assert positive(row["subprocess"]["ratio_p50"])
    assert res["peers"]["published"]["zeroboot"]["fork_p50_ms"] == 0.79  # shown as published
    for case in KERNEL_CASES:
        row = res["kernel"]["cases"][case]
        assert positive(row["zeroboot"]["p50_ms"]) and positive(row["python3"]["p99_ms"]) and positive(row["ratio_p50"])
    assert all(positive(res["kernel"][key][k]) for key in ("startup_ms", "restart_ms") for k in ("zeroboot", "python3"))
    assert "template_build_full_s" not in res["engine"]  # --quick builds the numpy template only
    assert [r["live_forks"] for r in res["scaling"]["forks"]] == [1, 10]
    assert all(positive(r[f]) for r in res["scaling"]["forks"] for f in ("fork_p50_ms", "uss_kb_per_fork"))
    assert positive(res["scaling"]["cells_per_s_1_worker"]) and positive(res["scaling"]["cells_per_s_2_workers"])
    assert all(positive(v["guest_mb_s"]) and positive(v["exits_per_mb"]) for v in res["files"]["rows"].values())
    assert len(res["syscalls"]["rows"]) == 8
    assert all(positive(v[f]) for v in res["syscalls"]["rows"].values()
               for f in ("guest_us_per_op", "host_us_per_op", "ratio", "syscalls_per_op", "exits_per_op"))
    per = res["syscalls"]["per_syscall"]
    assert per["getppid"]["syscalls"]["getppid"]["per_op"] >= 1 and per["os.stat"]["syscalls"]["newfstatat"]["host_calls"] >= 1
    assert all(positive(x[f]) for v in per.values() for x in v["syscalls"].values()
               for f in ("per_op", "exit_us", "dispatch_us", "host_calls", "return_us"))
    assert len(res["syscalls"]["paths"]) == 5
    assert all(positive(us) for v in res["syscalls"]["paths"].values() for us in v.values())
    imports = res["syscalls"]["imports"]
    assert "skipped" in imports or all(positive(v["ratio"]) for v in imports.values())
    assert positive(res["startup"]["matmul_speed_vs_host"])
    for name in ("arrays", "dataframe"):
        row = res["memory"]["scenarios"][name]
        for side in ("zeroboot", "python3"):
            cells = row[side]["cells"]
            assert len(cells) == row["cells"]
            assert all(positive(c["ms"]) and positive(c["with_checkpoint_ms"]) and positive(c["pss_mb"]) for c in cells)
            assert all(isinstance(c["host_mb"], (int, float)) for c in cells)  # a drop: noisy, may be < 0
        assert positive(row["time_ratio"]) and positive(row["time_with_checkpoint_ratio"]) and positive(row["pss_ratio"])
        assert isinstance(row["memory_ratio"], (int, float))
    df = res["memory"]["scenarios"]["dataframe"]["zeroboot"]
    assert isinstance(df["rewind_depth"], int) and isinstance(df["rewind_5"]["ok"], bool)
    fill = res["memory"]["fill"]
    assert all(positive(fill[side][k]) for side in ("guest", "host") for k in ("fill_s", "ones_plus_s"))
    assert positive(fill["fill_speed_vs_host"]) and positive(res["memory"]["spill"]["write_mb_s"])
    assert res["batch"]["notebooks"] == QUICK_NOTEBOOKS
    assert all(positive(res["batch"]["tools"][tool]["notebooks_per_s"]) for tool in ("zeroboot", "papermill", "nbconvert"))
    assert positive(res["batch"]["tools"]["papermill"]["zeroboot_speedup"])
    assert all(positive(res["all"]["headline"][f]) for f in HEADLINE), res["all"]["headline"]
    report = (out / "PERFORMANCE.md").read_text()
    assert "## Summary" in report and "bench all --quick" in report and "(published)" in report
    for chart in ("peers.png", "scaling.png"):
        assert (out / "img" / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
