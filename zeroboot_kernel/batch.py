"""Batch execution of notebooks: `zeroboot-kernel execute` and `zeroboot_kernel.execute_notebooks`.

    results = execute_notebooks(["a.ipynb", "b.ipynb"], output_dir="out", parameters={"n": 3}, jobs=2)

`jobs` worker threads each own one engine process (EngineClient -> engine_server.py: the process a
kernel uses, with the template loaded once and the same seccomp lockdown). A worker takes the next
notebook, asks its engine for a `new_session` (a sandbox forked from the template in well under a
millisecond, with the notebook's folder mounted as the kernel would mount it, overlay mode: the
notebook's writes stay in its sandbox), runs the cells (notebook_runner.py: outputs as nbclient
writes them) and writes the executed notebook. No Jupyter kernel process, ZMQ socket or Python
start-up per notebook: that is where papermill and nbconvert spend their time.

Each worker thread spawns its engine itself and lives as long as it does: the engine's
PR_SET_PDEATHSIG fires when the spawning thread ends (see kernel.EngineOwner).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import nbformat

from . import engine_requests as req
from . import notebook_params
from .engine_client import EngineClient, EngineDied
from .errors import ZerobootError
from .kernel_config import DEFAULT_HIDDEN, KernelSettings
from .language_info import local_language_info
from .notebook_runner import (FAILED, OK, TIMED_OUT, NotebookOutcome, checkpoint_policy, has_kernel_magics,
                              run_notebook)

log = logging.getLogger(__name__)

STATUSES = (OK, FAILED, TIMED_OUT)
ISOLATED_KERNELSPEC = "zeroboot-isolated"  # kernelspec/zeroboot-isolated: ZEROBOOT_MODE=isolated, OUTPUTS=safe
OUTPUT_SUFFIX = ".executed.ipynb"   # without an output directory: NAME.executed.ipynb beside NAME.ipynb


class BatchError(ZerobootError):
    """The batch cannot start (bad arguments, two notebooks that would write the same file)."""


@dataclass
class NotebookResult:
    source: Path
    output: Path | None              # where the executed notebook was written (None: not written)
    status: str                      # "ok", "failed" or "timed out"
    seconds: float
    cells_run: int = 0
    error: str | None = None         # what stopped it (the cell, the exception), or why it did not run
    errors_allowed: int = 0
    notebook: nbformat.NotebookNode | None = field(default=None, repr=False)
    worker: str | None = None        # the Dask worker that ran it (dask_batch.py); None: this process

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class _Job:
    index: int
    source: Path
    output: Path | None


def output_paths(sources: Sequence[Path], output_dir: Path | None) -> list[Path]:
    """Where each executed notebook goes; BatchError if two would be written to one file or one
    would overwrite its own input."""
    paths = [(output_dir / s.name) if output_dir is not None else s.with_name(s.name.removesuffix(".ipynb") + OUTPUT_SUFFIX)
             for s in sources]
    seen: dict[Path, Path] = {}
    for src, out in zip(sources, paths):
        key = out.resolve()
        if key == src.resolve():
            raise BatchError(f"{src} would be overwritten by its own output: give another --output-dir")
        if key in seen:
            raise BatchError(f"{seen[key]} and {src} would both be written to {out}: give notebooks distinct names "
                             f"or run them into separate output directories")
        seen[key] = src
    return paths


def execute_notebooks(notebooks: Iterable[str | os.PathLike[str]], *, output_dir: str | os.PathLike[str] | None = None,
                      parameters: dict[str, Any] | None = None, jobs: int = 1, isolated: bool = False,
                      timeout: float | None = None, allow_errors: bool = False, template: str = "default",
                      write: bool = True, keep_notebooks: bool = False,
                      on_result: Callable[[NotebookResult], None] | None = None,
                      on_log: Callable[[str], None] | None = None, scheduler: str | None = None,
                      dask: bool = False, workers_write: bool = False) -> list[NotebookResult]:
    """Execute notebooks, each in its own sandbox forked from the template, `jobs` at a time.

    parameters: injected as papermill injects them (after the cell tagged `parameters`).
    isolated: every cell starts from the clean template (the zeroboot-isolated kernel's mode).
    timeout: seconds one cell may run (None: no limit); a cell past it stops its notebook ("timed out").
    allow_errors: a cell's error does not stop its notebook (cells tagged raises-exception always may).
    write: write each executed notebook (to output_dir/NAME.ipynb, else NAME.executed.ipynb beside it).
    keep_notebooks: keep each executed NotebookNode in its result (memory: all of them at once).
    on_result: called (from a worker thread, one call at a time) as each notebook finishes.
    scheduler: a Dask scheduler's address (tcp://HOST:PORT): the notebooks run as tasks on its
    workers (dask_batch.py); dask: the same on a LocalCluster of `jobs` worker processes;
    workers_write: the workers write the executed notebooks into output_dir themselves (a folder
    they all share) instead of sending them back.
    Returns one NotebookResult per notebook, in the given order."""
    sources = [Path(nb) for nb in notebooks]
    if jobs < 1:
        raise BatchError(f"jobs must be at least 1, not {jobs}")
    if timeout is not None and not timeout > 0:
        raise BatchError(f"timeout must be seconds > 0, not {timeout}")
    if parameters:
        notebook_params.parameters_source(parameters)  # a bad name or value fails now, not per notebook
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        raise BatchError(f"no such notebook: {', '.join(missing[:5])}")
    out_dir = Path(output_dir) if output_dir is not None else None
    outputs: list[Path | None] = list(output_paths(sources, out_dir)) if write else [None] * len(sources)
    if out_dir is not None and write:
        out_dir.mkdir(parents=True, exist_ok=True)
    if workers_write and (out_dir is None or not write or not (scheduler or dask)):
        raise BatchError("workers_write (--workers-write) needs a Dask cluster and an output directory they share")
    settings = _Settings(parameters or {}, isolated, timeout, allow_errors, template, keep_notebooks,
                         on_log or (lambda text: log.warning("%s", text)))
    if scheduler or dask:
        from . import dask_batch  # distributed is imported only here

        return dask_batch.execute_on_cluster(sources, outputs, settings, scheduler=scheduler, local_workers=jobs,
                                             workers_write=workers_write, on_result=on_result,
                                             on_log=settings.on_log)
    work: queue.Queue[_Job] = queue.Queue()
    for i, (src, out) in enumerate(zip(sources, outputs)):
        work.put(_Job(i, src, out))
    results: list[NotebookResult | None] = [None] * len(sources)
    report_lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []

    def report(job: _Job, result: NotebookResult) -> None:
        with report_lock:
            results[job.index] = result
            if on_result is not None:
                on_result(result)

    workers = [threading.Thread(target=_worker, args=(settings, work, report, stop, failures),
                                name=f"zeroboot-batch-{n}", daemon=True) for n in range(min(jobs, len(sources)))]
    for w in workers:
        w.start()
    try:
        for w in workers:
            while w.is_alive():
                w.join(0.2)  # wakes up for KeyboardInterrupt in the main thread
    except KeyboardInterrupt:
        stop.set()
        for w in workers:
            w.join(10)
        raise
    return [r if r is not None else NotebookResult(src, None, FAILED, 0.0, error="not run: every worker engine failed "
                                                   f"({failures[0] if failures else 'unknown'})")
            for r, src in zip(results, sources)]


@dataclass(frozen=True)
class _Settings:
    parameters: dict[str, Any]
    isolated: bool
    timeout: float | None
    allow_errors: bool
    template: str
    keep_notebooks: bool
    on_log: Callable[[str], None]


def _start_engine(settings: _Settings) -> EngineClient:
    # as many checkpoints as the kernel keeps by default, so %rewind N reaches as far; they only
    # hold what the cells changed and go with the notebook's session
    return EngineClient(template=settings.template, mode="isolated" if settings.isolated else "chained",
                        timeout=settings.timeout, checkpoints=KernelSettings.checkpoints, on_log=settings.on_log)


def _worker(settings: _Settings, work: queue.Queue[_Job], report: Callable[[_Job, NotebookResult], None],
            stop: threading.Event, failures: list[BaseException]) -> None:
    client: EngineClient | None = None
    reusable: list[_Reusable] = []  # what the engine's session can be reset to, after a notebook without magics
    try:
        while not stop.is_set():
            try:
                job = work.get_nowait()
            except queue.Empty:
                return
            if client is None or not client.alive():
                if client is not None:
                    client.close(timeout=0.2)
                reusable.clear()
                try:
                    client = _start_engine(settings)
                except (ZerobootError, OSError) as exc:
                    failures.append(exc)
                    report(job, NotebookResult(job.source, None, FAILED, 0.0, error=f"the sandbox engine did not "
                                                                                     f"start: {exc}"))
                    client = None
                    continue
            report(job, _run_one(client, job, settings, stop, reusable))
    finally:
        if client is not None:
            client.close()


@dataclass(frozen=True)
class _Reusable:
    """The engine's session after a notebook that changed nothing but the sandbox (no kernel
    magics): restoring its clean state is as good as a new session for the same folder and mode."""
    project: str
    mode: str


def _run_one(client: EngineClient, job: _Job, settings: _Settings, stop: threading.Event,
             reusable: list[_Reusable]) -> NotebookResult:
    t0 = time.monotonic()
    try:
        nb = nbformat.read(job.source, as_version=4)
    except (OSError, ValueError) as exc:  # nbformat raises ValueError subclasses for bad JSON or schema
        return NotebookResult(job.source, None, FAILED, 0.0, error=f"cannot read the notebook: {exc}"[:500])
    if settings.parameters:
        notebook_params.inject_parameters(nb, settings.parameters)
    language_info = {**local_language_info(), **(client.info.get("language_info") or {})}
    # a notebook saved with the isolated kernelspec runs as that kernel runs it: isolated cells, safe outputs
    kernelspec = nb.metadata.get("kernelspec")
    as_isolated_kernel = isinstance(kernelspec, dict) and kernelspec.get("name") == ISOLATED_KERNELSPEC
    mode = "isolated" if settings.isolated or as_isolated_kernel else "chained"
    project = str(job.source.resolve().parent)
    magics = has_kernel_magics(nb)
    outcome: NotebookOutcome
    try:
        # The next notebook of the same folder and mode, after one without magics: the session's
        # sandbox restored to its clean state (`restart`: what isolated cells get between cells;
        # nothing of the last notebook survives, fresh random seeds), whose VM mappings are warm,
        # instead of a new fork whose first cells fault every page in again (~40% of a small
        # notebook's time here). Anything else: a new session forked from the template.
        if reusable == [_Reusable(project, mode)] and not magics:
            reply = client.call(req.RESTART)
        else:
            reply = client.call(req.NEW_SESSION, project=project, mode=mode, timeout=settings.timeout or 0,
                                hide=list(DEFAULT_HIDDEN), checkpoints=checkpoint_policy(nb))
        reusable.clear()
        if reply.get("status") != "ok":
            return NotebookResult(job.source, None, FAILED, time.monotonic() - t0,
                                  error=f"no sandbox for the notebook: {reply.get('evalue', reply)}"[:500])
        outcome = run_notebook(client, nb, notebook_dir=str(job.source.resolve().parent),
                               mode=mode, timeout=settings.timeout, allow_errors=settings.allow_errors,
                               language_info=language_info, policy="safe" if as_isolated_kernel else "trusted",
                               should_stop=stop.is_set)
        if not magics:
            reusable.append(_Reusable(project, mode))
    except EngineDied as exc:
        outcome = NotebookOutcome(FAILED, notes=[f"the sandbox engine died: {exc}"])
    seconds = time.monotonic() - t0
    if job.output is not None:
        _write_atomically(nb, job.output)
    error = str(outcome.error) if outcome.error is not None and outcome.status != OK else None
    if outcome.notes:
        error = "; ".join(filter(None, [error, *outcome.notes]))
    return NotebookResult(job.source, job.output, outcome.status, seconds, outcome.cells_run, error,
                          outcome.errors_allowed, nb if settings.keep_notebooks else None)


def _write_atomically(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write the notebook next to its destination, then rename: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        nbformat.write(nb, str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def summary_table(results: Sequence[NotebookResult]) -> str:
    """The table `zeroboot-kernel execute` prints at the end."""
    width = max([len("notebook")] + [len(str(r.source)) for r in results])
    lines = [f"{'notebook':<{width}}  {'status':<9}  {'seconds':>8}  {'cells':>5}  detail"]
    for r in results:
        detail = r.error or (f"{r.errors_allowed} error(s) allowed" if r.errors_allowed else "")
        lines.append(f"{str(r.source):<{width}}  {r.status:<9}  {r.seconds:>8.2f}  {r.cells_run:>5}  {detail}")
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    lines.append(f"{len(results)} notebook(s): {counts[OK]} ok, {counts[FAILED]} failed, {counts[TIMED_OUT]} timed out")
    return "\n".join(lines)
