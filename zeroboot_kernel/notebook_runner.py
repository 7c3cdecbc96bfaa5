"""Run one notebook's cells in an engine process and fill in its outputs the way nbclient does.

The batch executor (batch.py) hands each notebook to an engine process it keeps (EngineClient,
engine_server.py): a `new_session` request forks a fresh sandbox from the template with the
notebook's folder, then one `execute` request per code cell, the same requests and events the
kernel turns into IOPub messages. Here the events become nbformat outputs instead, with the rules
of nbclient's NotebookClient (client.py: async_execute_cell, process_message, output,
clear_output, _update_display_id), so a notebook written here has the structure nbclient writes
with the stock kernel:

* every code cell starts with no outputs and no execution count (papermill's reset: cells not run
  after a stop show nothing stale); blank code cells are skipped, as nbclient skips them;
* the k-th executed cell gets execution_count k, its execute_result carries it too;
* outputs are nbformat.v4.output_from_msg of the events (stream text batched into messages as
  the kernel batches it, stream_batch.py); clear_output (wait or not), display ids
  (update_display_data updates every output of that id, in every cell) as nbclient handles them;
* cell.metadata.execution holds nbclient's four timestamps (record_timing), the notebook's
  metadata.language_info what the kernel reports in kernel_info;
* a cell that ends in an error stops the notebook unless errors are allowed (allow_errors, or the
  cell is tagged `raises-exception`); a cell that runs past the batch's timeout stops it always
  (nbclient raises CellTimeoutError whatever allow_errors says); past a timeout the notebook set
  itself (`%sandbox timeout`) it is an ordinary error, as under the kernel;
* kernel magics (`%sandbox`, `%rewind`) run as the kernel runs them (batch_magics.py), their text a
  stdout stream output.

What the guest sends is hostile input: the events were checked by EngineClient.request
(schema.check_event); the outputs a notebook may accumulate are bounded (MAX_OUTPUT_CHARS).
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import nbformat

from . import engine_requests as req
from . import magics as mg
from . import outputs as output_policy
from . import schema
from .batch_magics import BatchMagics, MagicFailed
from .engine_client import EngineClient, EngineDied
from .stream_batch import StreamBatcher

log = logging.getLogger(__name__)

OK, FAILED, TIMED_OUT = "ok", "failed", "timed out"
TIMEOUT_ENAME = "SandboxTimeout"   # what session.py's rollback names a cell stopped at its timeout
ALLOW_ERRORS_TAG = "raises-exception"
MAX_OUTPUT_CHARS = 256 << 20       # of output text and data one notebook may gather (then dropped, with a note)
OUTPUT_EVENTS = ("display_data", "update_display_data", "execute_result", "error", "clear_output")


def timestamp() -> str:
    """nbclient's timestamp format (a message header's date, UTC)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class CellError:
    cell_index: int
    ename: str
    evalue: str

    def __str__(self) -> str:
        return f"cell {self.cell_index}: {self.ename}: {self.evalue}"[:500]


@dataclass
class NotebookOutcome:
    status: str                       # OK, FAILED or TIMED_OUT
    cells_run: int = 0
    error: CellError | None = None    # what stopped the notebook (or the first allowed error)
    errors_allowed: int = 0           # errors that did not stop it (allow_errors, raises-exception)
    notes: list[str] = field(default_factory=list)


class _CellOutputs:
    """The outputs of the running cell, and the notebook-wide display-id map (nbclient's
    _display_id_map: display id -> cell index -> output indices)."""

    def __init__(self, nb: nbformat.NotebookNode, policy: str, budget: list[int]) -> None:
        self.nb = nb
        self.policy = policy
        self.budget = budget          # [chars left], shared by the notebook's cells
        self.display_ids: dict[str, dict[int, list[int]]] = {}
        self.cell_index = -1
        self.outs: list[nbformat.NotebookNode] = []
        self.clear_before_next = False
        self.truncated = False

    def start(self, cell_index: int, cell: nbformat.NotebookNode) -> None:
        self.cell_index = cell_index
        self.outs = cell.outputs = []
        self.clear_before_next = False

    def _charge(self, content: dict[str, Any]) -> bool:
        size = sum(len(v) if isinstance(v, str) else len(str(v)) for v in _leaves(content))
        if size > self.budget[0]:
            if not self.truncated:
                self.truncated = True
                self.outs.append(nbformat.v4.new_output(
                    "stream", name="stderr",
                    text=f"zeroboot-kernel execute: this notebook's outputs passed {MAX_OUTPUT_CHARS >> 20} MiB; "
                         f"the rest are not written\n"))
            return False
        self.budget[0] -= size
        return True

    def stream(self, name: str, text: str) -> None:
        self._output("stream", {"name": name, "text": text})

    def event(self, kind: str, content: dict[str, Any], execution_count: int) -> None:
        if kind == "clear_output":
            if content.get("wait"):
                self.clear_before_next = True
            else:
                self.outs[:] = []
                self._forget_cell_display_ids()
            return
        if kind in ("display_data", "update_display_data", "execute_result"):
            content = output_policy.filter_content(content, self.policy)
        if kind == "execute_result":
            content = {**content, "execution_count": execution_count}
        transient = content.get("transient") or {}
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        if display_id and kind in ("execute_result", "display_data", "update_display_data"):
            self._update_display_id(display_id, content)
        if kind != "update_display_data":
            self._output(kind, content, display_id)

    def _output(self, kind: str, content: dict[str, Any], display_id: str | None = None) -> None:
        if not self._charge(content):
            return
        out = nbformat.v4.output_from_msg({"header": {"msg_type": kind}, "content": content})
        if self.clear_before_next:
            self.outs[:] = []
            self._forget_cell_display_ids()
            self.clear_before_next = False
        if display_id:
            self.display_ids.setdefault(display_id, {}).setdefault(self.cell_index, []).append(len(self.outs))
        self.outs.append(out)

    def _update_display_id(self, display_id: str, content: dict[str, Any]) -> None:
        cells = self.display_ids.get(display_id)
        if not cells:
            return
        out = nbformat.v4.output_from_msg({"header": {"msg_type": "display_data"}, "content": content})
        for cell_index, indices in cells.items():
            outs = self.outs if cell_index == self.cell_index else self.nb.cells[cell_index].outputs
            for i in indices:
                if i < len(outs):
                    outs[i]["data"] = out["data"]
                    outs[i]["metadata"] = out["metadata"]

    def _forget_cell_display_ids(self) -> None:
        for cells in self.display_ids.values():
            if self.cell_index in cells:
                cells[self.cell_index] = []


def _leaves(value: Any) -> list[Any]:
    """The strings and numbers of a decoded JSON value (iterative: the guest chose its depth,
    schema.check_event bounded it)."""
    out: list[Any] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
            out.extend(v.keys())
        elif isinstance(v, list):
            stack.extend(v)
        else:
            out.append(v)
    return out


def has_kernel_magics(nb: nbformat.NotebookNode) -> bool:
    """Conservative: any mention of the kernel's magics in a code cell (a false positive costs a
    new session, or checkpoints before every cell)."""
    return any(c.cell_type == "code" and ("%sandbox" in c.source or "%rewind" in c.source) for c in nb.cells)


def checkpoint_policy(nb: nbformat.NotebookNode) -> str:
    """new_session's `checkpoints` for running `nb`: only the cells NotebookRun asks for (those
    whose error lets the notebook go on) get a checkpoint, unless a cell uses the kernel's magics
    (%rewind needs one before every cell; %sandbox checkpoints shows them)."""
    return req.EVERY_CELL if has_kernel_magics(nb) else req.REQUESTED


def reset_outputs(nb: nbformat.NotebookNode) -> None:
    """papermill's start: no code cell keeps outputs or a count from an earlier run."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None


class NotebookRun:
    """The cells of one notebook, run one at a time in the engine's current session (the caller
    sent new_session with `mode` and `timeout`): run_notebook runs them all, the papermill engine
    (papermill_engine.py) one per papermill cell callback."""

    def __init__(self, client: EngineClient, nb: nbformat.NotebookNode, *, notebook_dir: str, mode: str = "chained",
                 timeout: float | None = None, allow_errors: bool = False,
                 language_info: dict[str, Any] | None = None, policy: str = "trusted") -> None:
        self.client = client
        self.nb = nb
        self.timeout = timeout
        self.allow_errors = allow_errors
        if language_info:
            nb.metadata["language_info"] = dict(language_info)
        self.outcome = NotebookOutcome(OK)
        self.sink = _CellOutputs(nb, policy, [MAX_OUTPUT_CHARS])
        self.magics = BatchMagics(client, mode=mode, timeout=timeout, notebook_dir=notebook_dir, outputs=policy)
        self.count = 0

    def execute_cell(self, index: int) -> bool:
        """Run cell `index` (blank and non-code cells are skipped, as nbclient skips them),
        filling in its outputs, count and metadata; False when the notebook must stop there
        (self.outcome says why). EngineDied propagates (the engine is gone)."""
        cell = self.nb.cells[index]
        if cell.cell_type != "code" or not cell.source.strip():
            return True
        self.count += 1
        timing: dict[str, str] = {}
        self.sink.start(index, cell)
        # a checkpoint for the cells whose error lets the notebook go on: a crash there rolls back
        # and the next cells run on; the crash of any other cell ends the notebook, nothing to keep
        errors_allowed = self.allow_errors or ALLOW_ERRORS_TAG in cell.metadata.get("tags", [])
        try:
            reply = _run_cell(self.client, cell.source, self.count, self.sink, self.magics, timing,
                              checkpoint=errors_allowed)
        finally:  # assigned whole: a NotebookNode stores a copy of a dict it is given
            cell.metadata["execution"] = timing
        cell.execution_count = self.count
        outcome = self.outcome
        outcome.cells_run += 1
        if reply.get("status") == "ok":
            if schema.asks_exit(reply.get("payload") or []):
                # exit() ends the kernel under ipykernel, so nbclient stops there with a dead kernel
                outcome.status = FAILED
                outcome.error = CellError(index, "DeadKernelError", "the notebook called exit(): the kernel ended "
                                                                    "here, as it does under ipykernel")
                return False
            return True
        error = CellError(index, str(reply.get("ename", "Error")), str(reply.get("evalue", "")))
        if error.ename == TIMEOUT_ENAME and self.timeout and not self.magics.timeout_changed:
            outcome.status, outcome.error = TIMED_OUT, error
            return False
        if errors_allowed:
            outcome.errors_allowed += 1
            outcome.error = outcome.error or error
            return True
        outcome.status, outcome.error = FAILED, error
        return False

    def finish(self) -> NotebookOutcome:
        if self.sink.truncated:
            self.outcome.notes.append(f"outputs over {MAX_OUTPUT_CHARS >> 20} MiB were dropped")
        return self.outcome


def run_notebook(client: EngineClient, nb: nbformat.NotebookNode, *, notebook_dir: str, mode: str = "chained",
                 timeout: float | None = None, allow_errors: bool = False,
                 language_info: dict[str, Any] | None = None, policy: str = "trusted",
                 should_stop: Callable[[], bool] = lambda: False) -> NotebookOutcome:
    """Execute `nb`'s code cells in the engine's current session, filling in outputs, counts
    and metadata in place (NotebookRun), after papermill's reset of every code cell."""
    reset_outputs(nb)
    run = NotebookRun(client, nb, notebook_dir=notebook_dir, mode=mode, timeout=timeout, allow_errors=allow_errors,
                      language_info=language_info, policy=policy)
    for index in range(len(nb.cells)):
        if should_stop():
            run.outcome.status = FAILED
            run.outcome.notes.append("stopped before the end (interrupted)")
            break
        if not run.execute_cell(index):
            break
    return run.finish()


def _run_cell(client: EngineClient, source: str, count: int, sink: _CellOutputs, magics: BatchMagics,
              timing: dict[str, str], checkpoint: bool) -> dict[str, Any]:
    """One cell: its kernel magics, then one execute request for the rest (`checkpoint`: it
    asks for a checkpoint, read by a session of REQUESTED checkpoints); returns the reply content
    (status, ename, evalue, ...)."""
    timing["iopub.status.busy"] = timestamp()
    timing["iopub.execute_input"] = timestamp()
    try:
        plan = mg.split_cell(source)
        for magic in plan.magics:
            text = magics.run(magic)
            sink.policy = magics.outputs
            if text:
                sink.stream("stdout", text)
    except mg.MagicUsageError as exc:
        return _kernel_error(sink, count, timing, "UsageError", str(exc))
    except MagicFailed as exc:
        return _kernel_error(sink, count, timing, exc.ename, exc.evalue)
    if not plan.touches_guest:
        timing["shell.execute_reply"] = timing["iopub.status.idle"] = timestamp()
        return {"status": "ok"}
    streams = StreamBatcher(sink.stream)
    reply: dict[str, Any] | None = None
    try:
        for ev in client.request(req.EXECUTE, code=plan.code, execution_count=count, silent=False,
                                 store_history=True, user_expressions={}, allow_stdin=False, checkpoint=checkpoint):
            kind = ev["event"]
            if kind == "stream":
                streams.write(ev["name"], ev["text"])
                continue
            if kind == "log":
                log.info("engine: %s", ev["text"])
                continue
            streams.flush()
            if kind in OUTPUT_EVENTS:
                sink.event(kind, ev["content"], count)
            elif kind == "reply":
                timing["shell.execute_reply"] = timestamp()
                reply = ev["content"]
            elif kind == "input_request":  # allow_stdin is false: the agent never asks; a forged one is ignored
                log.warning("a cell asked for input in batch execution; ignored")
    finally:
        streams.flush()
    timing["iopub.status.idle"] = timestamp()
    if reply is None:
        raise EngineDied("the engine ended the cell without a reply")
    return reply


def _kernel_error(sink: _CellOutputs, count: int, timing: dict[str, str], ename: str, evalue: str) -> dict[str, Any]:
    """An error the executor reports itself, shown as the kernel shows it."""
    content = {"ename": ename, "evalue": evalue, "traceback": [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]}
    sink.event("error", content, count)
    timing["shell.execute_reply"] = timing["iopub.status.idle"] = timestamp()
    return {"status": "error", **content}
