"""The soak benchmark, short (`python -m zeroboot_kernel.bench soak --cells 500`): one kernel runs
500 mixed cells (prints, numpy, errors, crashes, timeouts, rewinds, displays); every cell must do what
it should, and the fds of the kernel and engine must stay flat after the warm-up. A leak check, not a
timing test: no assertion here depends on how fast the machine is."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernel_helpers import ensure_kernelspecs
from zeroboot_kernel.bench import soak

CELLS = 500
FD_SLACK = 2         # kernel fds, and engine fds other than snapshot stores: flat
STORE_SLACK = 16     # snapshot stores (memfds) come and go with the kept checkpoints, within a bound

TOP_FIELDS = ("benchmark", "date", "machine", "cells", "cells_done", "kernel_name", "cycle", "sample_every",
              "warmup_cells", "duration_s", "cells_per_s", "failure_count", "failures", "aborted", "growth",
              "round_trip_ms", "samples")
SAMPLE_FIELDS = ("cells", "elapsed_s", "p50_ms", "failures", "kernel", "engine", "engine_pids", "sandbox")
USAGE_FIELDS = ("rss_kib", "anon_kib", "file_kib", "shmem_kib", "threads", "fds", "memfds", "memfd_kib")
SANDBOX_FIELDS = ("guest_mib", "checkpoint_mib", "cells_run", "rollbacks")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict[str, Any]]:
    """(exit status, results path, results) of one 500-cell soak through the CLI."""
    ensure_kernelspecs()
    out = tmp_path_factory.mktemp("soak") / "soak.json"
    code = soak.main(["--cells", str(CELLS), "--out", str(out)])
    return code, out, json.loads(out.read_text())


def _after_warmup(results: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in results["samples"] if s["cells"] >= results["warmup_cells"])


def test_every_cell_does_what_it_should(run: tuple[int, Path, dict[str, Any]]) -> None:
    code, _, results = run
    assert results["failures"] == [] and results["failure_count"] == 0, results["failures"][:5]
    assert results["aborted"] is None
    assert results["cells_done"] == CELLS
    assert code == 0
    # every kind of cell of the cycle ran, the slow ones included
    assert set(results["round_trip_ms"]) == set(results["cycle"])


def test_results_have_every_field(run: tuple[int, Path, dict[str, Any]]) -> None:
    _, out, results = run
    assert out.with_suffix(".md").read_text().startswith("# Soak")
    assert [f for f in TOP_FIELDS if f not in results] == []
    assert results["benchmark"] == "soak" and results["cells"] == CELLS
    assert len(results["samples"]) >= 3
    for s in results["samples"]:
        assert [f for f in SAMPLE_FIELDS if f not in s] == [], s
        for proc in ("kernel", "engine"):
            assert [f for f in USAGE_FIELDS if f not in s[proc]] == [], s[proc]
            assert s[proc]["rss_kib"] > 0 and s[proc]["fds"] > 0
        # `%sandbox stats` still says what the soak reads from it
        assert all(s["sandbox"][f] is not None for f in SANDBOX_FIELDS), s["sandbox"]
    assert results["samples"][0]["cells"] == 0 and results["samples"][-1]["cells"] == CELLS
    # one engine process for the whole run, never restarted
    assert len({tuple(s["engine_pids"]) for s in results["samples"]}) == 1
    growth = results["growth"]
    assert growth is not None and growth["to_cells"] == CELLS
    for proc in ("kernel", "engine"):
        for key in ("rss_kib", "fds", "memfds"):
            for suffix in ("change", "per_1000_cells", "slope_per_1000_cells"):
                assert f"{proc}_{key}_{suffix}" in growth


def test_fds_stay_flat(run: tuple[int, Path, dict[str, Any]]) -> None:
    _, _, results = run
    warm, end = _after_warmup(results), results["samples"][-1]
    assert end["kernel"]["fds"] <= warm["kernel"]["fds"] + FD_SLACK, (warm["kernel"], end["kernel"])
    other = [s["engine"]["fds"] - s["engine"]["memfds"] for s in (warm, end)]
    assert other[1] <= other[0] + FD_SLACK, (warm["engine"], end["engine"])
    assert end["engine"]["memfds"] <= warm["engine"]["memfds"] + STORE_SLACK, (warm["engine"], end["engine"])
