"""`papermill IN.ipynb OUT.ipynb --engine zeroboot`: papermill's engine interface over the batch
executor's notebook runner, so papermill pipelines switch with one option.

papermill keeps everything it does around an engine (parameters, the notebook's and cells'
metadata.papermill, the progress bar, saving after each cell, the error banner cell, the exit
status); the engine only runs the cells (papermill.engines.Engine.execute_managed_notebook). This
one starts an engine process (engine_server.py, as a kernel does), forks a sandbox for the notebook
from the template with the working directory papermill chose (`--cwd`, else its own) as the
notebook's folder, and runs each cell through notebook_runner.NotebookRun, calling papermill's
cell_start / cell_exception / cell_complete around it as papermill's nbclient engine does. A cell
error stops the run there (papermill then raises PapermillExecutionError and writes the banner);
`--execution-timeout` is the cell timeout. Registered as the `papermill.engine` entry point
`zeroboot` (pyproject.toml); the kernel name papermill passes (`-k`) selects isolated cells for
`zeroboot-isolated` and is otherwise ignored: every notebook runs in a zeroboot sandbox.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from papermill.engines import Engine
from papermill.exceptions import PapermillExecutionError

from . import engine_requests as req
from .batch import ISOLATED_KERNELSPEC
from .engine_client import EngineClient
from .errors import ZerobootError
from .kernel_config import DEFAULT_HIDDEN, KernelSettings
from .language_info import local_language_info
from .notebook_runner import NotebookRun, checkpoint_policy

log = logging.getLogger("papermill.zeroboot")


class ZerobootEngine(Engine):
    @classmethod
    def execute_managed_notebook(cls, nb_man: Any, kernel_name: str | None, log_output: bool = False,
                                 stdout_file: Any = None, stderr_file: Any = None, start_timeout: float = 60,
                                 execution_timeout: float | None = None, **kwargs: Any) -> Any:
        nb = nb_man.nb
        spec = nb.metadata.get("kernelspec")
        spec_name = spec.get("name") if isinstance(spec, dict) else None
        isolated = ISOLATED_KERNELSPEC in (kernel_name, spec_name)
        mode = "isolated" if isolated else "chained"
        timeout = float(execution_timeout) if execution_timeout else None
        folder = os.getcwd()  # papermill has changed into --cwd, as it does before starting a kernel
        client = EngineClient(template=os.environ.get("ZEROBOOT_TEMPLATE") or "default", mode=mode, timeout=timeout,
                              checkpoints=KernelSettings.checkpoints, on_log=lambda text: log.info("%s", text))
        try:
            reply = client.call(req.NEW_SESSION, project=folder, mode=mode, timeout=timeout or 0,
                                hide=list(DEFAULT_HIDDEN), checkpoints=checkpoint_policy(nb))
            if reply.get("status") != "ok":
                raise ZerobootError(f"no sandbox for the notebook: {reply.get('evalue', reply)}")
            run = NotebookRun(client, nb, notebook_dir=folder, mode=mode, timeout=timeout,
                              language_info={**local_language_info(), **(client.info.get("language_info") or {})},
                              policy="safe" if isolated else "trusted")
            for index, cell in enumerate(nb.cells):
                nb_man.cell_start(cell, index)
                try:
                    if not run.execute_cell(index):
                        error = run.outcome.error
                        nb_man.cell_exception(nb.cells[index], cell_index=index, exception=PapermillExecutionError(
                            cell_index=index, exec_count=nb.cells[index].execution_count, source=cell.source,
                            ename=error.ename if error else "Error", evalue=error.evalue if error else "",
                            traceback=[]))
                        break
                finally:
                    nb_man.cell_complete(nb.cells[index], cell_index=index)
            run.finish()
        finally:
            client.close()
        return nb
