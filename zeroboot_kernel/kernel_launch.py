"""The kernel process's entry point (the kernelspecs' argv):

    python -m zeroboot_kernel.kernel_launch -f {connection_file}

It starts the sandbox engine first, then imports and runs the Jupyter kernel (kernel.py). The
engine is a process of its own that takes ~0.4 s to be ready (plus a ~50 ms warm-up request), and
importing ipykernel and the kernel takes ~0.3 s more before the kernel could start it: one after
the other, a user's first cell waited for the engine after the kernel was ready. Side by side, on
a host with two or more CPUs, the engine is ready about when the kernel is.
(`python -m zeroboot_kernel.kernel` still works: it starts its engine once it is set up.)
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    try:
        from . import engine_owner
        from .kernel_config import KernelSettings

        engine_owner.start_early(KernelSettings.from_env(), os.path.realpath(os.getcwd()))
    except Exception as exc:  # noqa: BLE001 - the kernel starts its engine itself and reports why it cannot
        log.debug("no early engine start: %s", exc)
    from .kernel import main as kernel_main

    return kernel_main(argv)


if __name__ == "__main__":
    sys.exit(main())
