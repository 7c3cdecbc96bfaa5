"""`zeroboot-kernel execute --scheduler` / `--dask`: notebooks as tasks on a Dask cluster (issue 18
item 2; zeroboot_kernel/dask_batch.py).

One LocalCluster of 2 worker processes, plus a third worker started in a private mount namespace
whose /dev has no kvm node (as tests/test_no_kvm.py does): that worker must be reported with the
engine's own reason and get no notebook, or, when a notebook is sent to it on purpose, fail it with
that reason so that it is retried on the others. The executed notebooks must hold what the local
batch executor writes for the same notebooks.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat import v4

pytestmark = pytest.mark.kvm
distributed = pytest.importorskip("distributed")

NO_KVM_NAME = "worker-without-kvm"


def _notebook(i: int) -> nbformat.NotebookNode:
    params = v4.new_code_cell("n = 3")
    params.metadata["tags"] = ["parameters"]
    nb = v4.new_notebook(cells=[params, v4.new_code_cell(f"import numpy as np\nx = np.arange(n) * {i}\nprint('nb', {i}, x.sum())"),
                                v4.new_code_cell("x.tolist()")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _outputs(nb: nbformat.NotebookNode) -> list[list[tuple[str, str]]]:
    return [[(o.output_type, o.get("text") or str(o.get("data", {}).get("text/plain", ""))) for o in c.outputs]
            for c in nb.cells if c.cell_type == "code"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """(LocalCluster of 2 worker processes, address of the extra worker without /dev/kvm). A
    template cache of the module's own: the workers inherit XDG_CACHE_HOME."""
    from distributed import Client, LocalCluster

    from zeroboot_kernel.template import Template

    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    Template.ensure()  # built once, before the workers load it
    local = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    no_kvm = None
    if shutil.which("unshare") is not None:
        script = "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && exec \"$@\""
        no_kvm = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                   sys.executable, "-m", "distributed.cli.dask_worker", local.scheduler_address,
                                   "--nthreads", "1", "--no-nanny", "--name", NO_KVM_NAME, "--no-dashboard"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        address = ""
        if no_kvm is not None:
            with Client(local) as client:
                client.wait_for_workers(3, timeout=120)
                address = next(a for a, w in client.scheduler_info()["workers"].items() if w.get("name") == NO_KVM_NAME)
        yield local, address
    finally:
        if no_kvm is not None:
            no_kvm.terminate()
            no_kvm.wait(30)
        local.close()
        mp.undo()


@pytest.fixture
def notebooks(tmp_path: Path) -> list[Path]:
    src = tmp_path / "src"
    src.mkdir()
    paths = []
    for i in range(4):
        paths.append(src / f"nb{i}.ipynb")
        nbformat.write(_notebook(i), str(paths[-1]))
    return paths


def _local_reference(paths: list[Path], out: Path) -> dict[str, list[list[tuple[str, str]]]]:
    from zeroboot_kernel import execute_notebooks

    results = execute_notebooks(paths, output_dir=out, parameters={"n": 5}, jobs=1)
    assert all(r.ok for r in results), [r.error for r in results]
    return {p.name: _outputs(nbformat.read(str(out / p.name), as_version=4)) for p in paths}


def test_cluster_runs_notebooks_as_the_local_batch_does(cluster: tuple[Any, str], notebooks: list[Path],
                                                       tmp_path: Path) -> None:
    from zeroboot_kernel import execute_notebooks

    local, no_kvm = cluster
    lines: list[str] = []
    results = execute_notebooks(notebooks, output_dir=tmp_path / "dask", parameters={"n": 5},
                                scheduler=local.scheduler_address, on_log=lines.append)
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.worker and r.worker != no_kvm for r in results)
    expected = _local_reference(notebooks, tmp_path / "local")
    for p in notebooks:
        assert _outputs(nbformat.read(str(tmp_path / "dask" / p.name), as_version=4)) == expected[p.name]
    assert "nb 3 30" in "".join(t for o in expected["nb3.ipynb"] for _, t in o)  # parameters injected
    if no_kvm:  # reported with the engine's reason, given nothing
        assert any(no_kvm in line and "/dev/kvm does not exist" in line and "gets no notebooks" in line
                   for line in lines), lines


def test_task_on_a_worker_without_kvm_is_retried(cluster: tuple[Any, str], notebooks: list[Path],
                                                 tmp_path: Path) -> None:
    from zeroboot_kernel import batch, dask_batch

    local, no_kvm = cluster
    if not no_kvm:
        pytest.skip("needs util-linux unshare for a worker without /dev/kvm")
    lines: list[str] = []
    settings = batch._Settings({}, False, None, False, "default", False, lines.append)
    outputs: list[Path | None] = [tmp_path / p.name for p in notebooks]
    results = dask_batch.execute_on_cluster(notebooks, outputs, settings, scheduler=local.scheduler_address,
                                            local_workers=0, on_log=lines.append, first_workers=[no_kvm])
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.worker != no_kvm for r in results)
    retried = [line for line in lines if "retried on another worker" in line]
    assert len(retried) == len(notebooks) and all("/dev/kvm does not exist" in line for line in retried), lines


def test_cli_scheduler_workers_write(cluster: tuple[Any, str], notebooks: list[Path], tmp_path: Path) -> None:
    local, _ = cluster
    out = tmp_path / "shared"
    proc = subprocess.run([sys.executable, "-m", "zeroboot_kernel", "execute", *map(str, notebooks), "--output-dir",
                           str(out), "--scheduler", local.scheduler_address, "--workers-write", "-p", "n", "2"],
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 notebook(s): 4 ok" in proc.stdout
    for i, p in enumerate(notebooks):
        nb = nbformat.read(str(out / p.name), as_version=4)
        assert f"nb {i} {i}" in "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def test_workers_write_needs_a_cluster(notebooks: list[Path], tmp_path: Path) -> None:
    from zeroboot_kernel import execute_notebooks
    from zeroboot_kernel.batch import BatchError

    with pytest.raises(BatchError, match="needs a Dask cluster"):
        execute_notebooks(notebooks, output_dir=tmp_path, workers_write=True)


def test_cluster_without_usable_workers(tmp_path: Path, notebooks: list[Path]) -> None:
    """A scheduler whose only worker has no KVM: a BatchError naming the reason, at once."""
    from distributed import LocalCluster

    from zeroboot_kernel import execute_notebooks
    from zeroboot_kernel.batch import BatchError

    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare for a worker without /dev/kvm")
    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as empty:
        script = "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && exec \"$@\""
        worker = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                   sys.executable, "-m", "distributed.cli.dask_worker", empty.scheduler_address,
                                   "--nthreads", "1", "--no-nanny", "--no-dashboard"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not empty.scheduler.workers and time.monotonic() < deadline:
                time.sleep(0.2)
            with pytest.raises(BatchError, match="(?s)no worker of the cluster can run sandboxes.*/dev/kvm does not exist"):
                execute_notebooks(notebooks, output_dir=tmp_path / "out", scheduler=empty.scheduler_address)
        finally:
            worker.terminate()
            worker.wait(30)
