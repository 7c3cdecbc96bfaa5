"""Autograding with nbgrader in zeroboot sandboxes: what a grader's `nbgrader_config.py` applies.

    # nbgrader_config.py in the course directory
    from zeroboot_kernel.grading import configure_nbgrader
    c = get_config()
    configure_nbgrader(c, timeout=30)

`nbgrader autograde` then runs every submission in a `zeroboot` kernel (nbgrader starts one kernel
per notebook; here that is one VM forked from the template, state carried from cell to cell, which
test cells need: the `zeroboot-isolated` kernel resets the sandbox after every cell, so no test
cell would see the student's functions). The settings below make that kernel a grading sandbox
(docs/GRADING.md explains each and what they do to hostile submissions):

* the sandbox shows the submission's own folder only (`ZEROBOOT_PROJECT_ROOT=notebook`): not the
  course directory above it (which, with a `.git` or `requirements.txt`, would be the project
  folder shown), so neither the gradebook nor any other student's files exist in the guest;
* writes stay in the sandbox (`ZEROBOOT_FILES=overlay`): a submission cannot change its own
  autograded folder, let alone `grades.csv` or `gradebook.db`;
* no environment (`ZEROBOOT_ENV=clean`: the grader's tokens are not the student's to read), no
  network, and outputs made safe for formgrader's browser (`ZEROBOOT_OUTPUTS=safe`: no JavaScript,
  sanitised HTML);
* nbgrader's cell timeout interrupts a runaway cell (`Execute.interrupt_on_timeout`); the kernel's
  own cell timeout, a little longer, stops and rolls back one that ignores the interrupt.

The environment variables are set in this process (the one running nbgrader): jupyter_client
starts each kernel with this environment plus the kernelspec's.
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

from . import guest_memory_size
from .errors import ZerobootError

GRADING_KERNEL = "zeroboot"        # kernelspec/zeroboot: chained cells (test cells see the answers)
IOPUB_TIMEOUT = 30                 # seconds nbgrader waits for a cell's last IOPub message after its reply
KERNEL_TIMEOUT_MARGIN = 5          # seconds the kernel's own cell timeout gives nbgrader's interrupt first


def grading_environment(timeout: float, memory: str | None = None) -> dict[str, str]:
    """The kernel settings (kernel_config.py, project_root.py, guest_environ.py) of a grading sandbox;
    memory: the guest's memory size (ZEROBOOT_MEMORY, e.g. "1G": a template of that size is built
    once), which bounds what one submission can hold on the host; None keeps the default."""
    if not timeout > 0:
        raise ZerobootError(f"the grading cell timeout must be seconds > 0, not {timeout!r}: a submission with an "
                            "infinite loop would otherwise hold the grader forever")
    env = {
        "ZEROBOOT_MODE": "chained",
        "ZEROBOOT_PROJECT_ROOT": "notebook",
        "ZEROBOOT_FILES": "overlay",
        "ZEROBOOT_ENV": "clean",
        "ZEROBOOT_NETWORK": "none",
        "ZEROBOOT_OUTPUTS": "safe",
        "ZEROBOOT_CELL_TIMEOUT": str(int(timeout) + KERNEL_TIMEOUT_MARGIN),
    }
    if memory is not None:
        guest_memory_size.parse_size(memory)  # a bad size fails here, not in every kernel
        env["ZEROBOOT_MEMORY"] = memory
    return env


def configure_nbgrader(c: Any, *, timeout: int = 30, memory: str | None = None,
                       environ: MutableMapping[str, str] | None = None) -> None:
    """Apply the grading settings to an nbgrader config object `c` (`get_config()`), and the
    kernel settings to `environ` (default: os.environ, which the kernels nbgrader starts inherit)."""
    env = os.environ if environ is None else environ
    env.update(grading_environment(timeout, memory))
    c.Execute.kernel_name = GRADING_KERNEL     # whatever kernelspec the submission names
    c.Execute.timeout = int(timeout)
    c.Execute.interrupt_on_timeout = True
    # nbgrader fails the whole submission (ungraded) when a cell's IOPub messages come later than
    # this after its reply (raise_on_iopub_timeout); nbclient's 4 s is short on a loaded grader
    c.Execute.iopub_timeout = max(IOPUB_TIMEOUT, int(timeout))
