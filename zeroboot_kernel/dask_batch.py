"""Batch execution on a Dask cluster: `zeroboot-kernel execute --scheduler tcp://HOST:PORT` / `--dask`.

    results = execute_notebooks(paths, output_dir="out", scheduler="tcp://10.0.0.5:8786")

Each notebook is one task of a `distributed` cluster. A worker plugin (ZerobootWorkerPlugin,
registered by the client) keeps each worker warm: at setup it loads (or builds) the template in
the worker's own cache, and each of the worker's task threads keeps one engine process (the same
EngineClient -> engine_server.py the local batch uses) from task to task, so a task costs what a
notebook costs in `--jobs N` locally: a fork of the template, no Python start-up. The task runs the
notebook with batch._run_one (notebook_runner.py: outputs as nbclient writes them).

The notebook travels with the task (its bytes and its path): a worker that sees the same file at
the same path (a shared file system) runs it in place, with its folder mounted as the local batch
does; any other worker runs it from a private folder holding the notebook alone. The executed
notebook comes back to the client, which writes it (`--output-dir`, else NAME.executed.ipynb), or,
with `workers_write=True`, each worker writes it into the output directory itself (which must be
a directory all workers share).

A worker without a usable /dev/kvm cannot run a notebook: its plugin records why (the engine's
own message, e.g. "/dev/kvm does not exist ... modprobe kvm_intel"), the client asks every worker
for that status before submitting and sends notebooks only to the others, logging each unusable
worker with the reason; a task that still fails on a worker for that reason (its KVM went away)
is submitted again to the other workers. No usable worker at all is a BatchError naming each
worker's reason.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from distributed import Client, LocalCluster, WorkerPlugin, as_completed, get_worker

from .batch import (BatchError, NotebookResult, _Job, _Reusable, _run_one, _Settings, _start_engine,
                    _write_atomically)
from .engine_client import EngineClient
from .errors import KvmUnavailableError, ZerobootError
from .notebook_runner import FAILED

log = logging.getLogger(__name__)

PLUGIN_NAME = "zeroboot-kernel"
MAX_ATTEMPTS = 3  # a notebook is sent to at most this many workers that turn out to have no KVM


class WorkerWithoutKvm(ZerobootError):
    """This worker cannot run sandboxes (no usable /dev/kvm); the client retries elsewhere.
    Pickled back to the client with its arguments (worker address, reason)."""

    def __init__(self, worker: str, reason: str) -> None:
        super().__init__(worker, reason)
        self.worker = worker
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def _worker_log(text: str) -> None:
    """The engine's lines on a worker (a template being built): the worker's log."""
    log.warning("%s", text)


def _engine_key(settings: _Settings) -> tuple[str, bool, float | None]:
    return settings.template, settings.isolated, settings.timeout


@dataclass
class _ThreadEngine:
    key: tuple[str, bool, float | None]
    client: EngineClient
    reusable: list[_Reusable] = field(default_factory=list)


class ZerobootWorkerPlugin(WorkerPlugin):
    """Keeps the worker's template loaded and one engine per task thread."""

    name = PLUGIN_NAME

    def __init__(self, template: str = "default") -> None:
        self.template = template
        self.error: str | None = None     # why this worker cannot run notebooks
        self.address = ""
        self._engines: dict[int, _ThreadEngine] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # sent to the workers before setup: no engines, no lock
        return {"template": self.template}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["template"])  # type: ignore[misc]

    async def setup(self, worker: Any) -> None:
        # a build (the first use on this machine) takes ~10 s: off the worker's event loop
        from .template import Template, TemplateConfig, default_preload

        self.address = str(worker.address)
        config = TemplateConfig(self.template, default_preload())  # what engine_server.py loads
        try:
            await asyncio.get_running_loop().run_in_executor(None, Template.ensure, config)
        except KvmUnavailableError as exc:
            self.error = f"worker {self.address} cannot run sandboxes: {exc}"
        except (ZerobootError, OSError) as exc:
            self.error = f"worker {self.address} has no template {self.template!r}: {exc}"
        if self.error:
            log.error("%s", self.error)

    def teardown(self, worker: Any) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for slot in engines:
            slot.client.close(timeout=0.5)

    def engine(self, settings: _Settings) -> _ThreadEngine:
        """This task thread's engine for these settings (started on its first notebook, again
        after it died). The engine dies with the thread that started it (PR_SET_PDEATHSIG):
        worker task threads live as long as the worker."""
        if self.error:
            raise WorkerWithoutKvm(self.address, self.error)
        tid = threading.get_ident()
        with self._lock:
            slot = self._engines.get(tid)
        if slot is not None and slot.key == _engine_key(settings) and slot.client.alive():
            return slot
        if slot is not None:
            slot.client.close(timeout=0.2)
        try:
            client = _start_engine(settings)
        except KvmUnavailableError as exc:
            self.error = f"worker {self.address} cannot run sandboxes: {exc}"
            raise WorkerWithoutKvm(self.address, self.error) from exc
        slot = _ThreadEngine(_engine_key(settings), client)
        with self._lock:
            self._engines[tid] = slot
        return slot


def _plugin_status(dask_worker: Any) -> str | None:
    """On each worker (Client.run): None when it can run notebooks, else why not."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    if plugin is None:
        return f"worker {dask_worker.address} has no {PLUGIN_NAME} plugin"
    return plugin.error


@dataclass(frozen=True)
class _Task:
    index: int
    path: str                 # the notebook's path on the client
    content: bytes            # and its bytes
    output: str | None        # where a worker writes it (workers_write), else None
    settings: _Settings


def _run_task(task: _Task) -> dict[str, Any]:
    """One notebook on a worker; returns the result's fields and, unless the worker wrote it,
    the executed notebook's JSON."""
    worker = get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, ZerobootWorkerPlugin):
        raise WorkerWithoutKvm(str(worker.address), f"worker {worker.address} has no {PLUGIN_NAME} plugin")
    slot = plugin.engine(task.settings)
    source = Path(task.path)
    with tempfile.TemporaryDirectory(prefix="zeroboot-dask-") as private:
        if not _same_file(source, task.content):
            source = Path(private) / source.name
            source.write_bytes(task.content)
        job = _Job(task.index, source, Path(task.output) if task.output else None)
        result = _run_one(slot.client, job, task.settings, threading.Event(), slot.reusable)
    notebook = nbformat.writes(result.notebook) if result.notebook is not None and task.output is None else None
    return {"status": result.status, "seconds": result.seconds, "cells_run": result.cells_run, "error": result.error,
            "errors_allowed": result.errors_allowed, "worker": str(worker.address), "notebook": notebook}


def _same_file(path: Path, content: bytes) -> bool:
    try:
        return path.is_file() and hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(content).digest()
    except OSError:
        return False


def execute_on_cluster(sources: Sequence[Path], outputs: Sequence[Path | None], settings: _Settings, *,
                       scheduler: str | None, local_workers: int, workers_write: bool = False,
                       on_result: Callable[[NotebookResult], None] | None = None,
                       on_log: Callable[[str], None] = _worker_log,
                       first_workers: Sequence[str] | None = None) -> list[NotebookResult]:
    """Run the notebooks as tasks on the cluster at `scheduler` (None: a LocalCluster of
    `local_workers` worker processes, one task thread each). outputs: where each executed
    notebook goes (None: not written). first_workers: the workers the first attempt goes to
    (tests: to send it to a worker without KVM on purpose); default: every usable one."""
    # on the workers: their own log, and the executed notebook back unless they write it
    settings = dataclasses.replace(settings, on_log=_worker_log, keep_notebooks=not workers_write)
    cluster = None
    t0 = time.monotonic()
    if scheduler is None:
        cluster = LocalCluster(n_workers=local_workers, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster if cluster is not None else scheduler)
    log.info("dask: connected to %s in %.1f s", client.scheduler.address, time.monotonic() - t0)
    try:
        t0 = time.monotonic()
        client.register_plugin(ZerobootWorkerPlugin(settings.template), name=PLUGIN_NAME)  # type: ignore[arg-type]
        statuses: dict[str, str | None] = client.run(_plugin_status)
        log.info("dask: %d worker(s) set up in %.1f s", len(statuses), time.monotonic() - t0)
        unusable = {addr: why for addr, why in statuses.items() if why}
        for why in unusable.values():
            on_log(f"{why}; it gets no notebooks")
        usable = sorted(set(statuses) - set(unusable))
        if not usable:
            raise BatchError("no worker of the cluster can run sandboxes:\n" +
                             "\n".join(f"  {why}" for why in unusable.values()) if unusable else
                             "the cluster has no workers")
        tasks = []
        for i, (src, out) in enumerate(zip(sources, outputs)):
            tasks.append(_Task(i, str(src.resolve()), src.read_bytes(),
                               str(out.resolve()) if (out is not None and workers_write) else None, settings))
        results: list[NotebookResult | None] = [None] * len(tasks)
        tried: dict[int, set[str]] = {i: set() for i in range(len(tasks))}

        def submit(task: _Task, workers: Sequence[str]) -> Any:
            return client.submit(_run_task, task, workers=list(workers), allow_other_workers=False, pure=False,
                                 key=f"zeroboot-notebook-{task.index}-{len(tried[task.index])}-{os.getpid()}")

        futures = {submit(t, first_workers or usable): t for t in tasks}
        pending = as_completed(list(futures))
        for future in pending:
            task = futures.pop(future)
            try:
                fields = future.result()
            except WorkerWithoutKvm as exc:
                bad = exc.worker
                tried[task.index].add(bad)
                on_log(f"{exc}; {Path(task.path).name} is retried on another worker")
                usable = [w for w in usable if w != bad]
                others = [w for w in usable if w not in tried[task.index]]
                if others and len(tried[task.index]) < MAX_ATTEMPTS:
                    retry = submit(task, others)
                    futures[retry] = task
                    pending.add(retry)
                    continue
                fields = {"status": FAILED, "seconds": 0.0, "error": f"no worker could run it: {exc}"}
            except Exception as exc:  # noqa: BLE001 - a task's failure is that notebook's result, not the batch's
                fields = {"status": FAILED, "seconds": 0.0, "error": f"the task failed: {type(exc).__name__}: {exc}"}
            result = _result(sources[task.index], outputs[task.index], fields, workers_write)
            results[task.index] = result
            if on_result is not None:
                on_result(result)
        return [r if r is not None else NotebookResult(src, None, FAILED, 0.0, error="not run")
                for r, src in zip(results, sources)]
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _result(source: Path, output: Path | None, fields: dict[str, Any], workers_write: bool) -> NotebookResult:
    notebook = fields.get("notebook")
    written: Path | None = None
    nb = None
    if isinstance(notebook, str):
        nb = nbformat.reads(notebook, as_version=4)
        if output is not None:
            _write_atomically(nb, output)
            written = output
    elif workers_write and output is not None and "worker" in fields:
        written = output
    return NotebookResult(source, written, str(fields.get("status", FAILED)), float(fields.get("seconds", 0.0)),
                          int(fields.get("cells_run", 0)), fields.get("error"), int(fields.get("errors_allowed", 0)),
                          nb, worker=fields.get("worker"))
