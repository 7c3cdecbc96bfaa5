"""The kernel_info `language_info` of this interpreter, for the kernel and the batch executor.

The guest runs this very interpreter (the template key includes sys.executable), so this is exact
until the engine reports the guest's own (its READY frame), which both callers merge over it.
"""
from __future__ import annotations

import platform
import sys
from typing import Any


def local_language_info() -> dict[str, Any]:
    """What ipykernel reports as language_info for this interpreter."""
    return {
        "name": "python",
        "version": platform.python_version(),
        "mimetype": "text/x-python",
        "codemirror_mode": {"name": "ipython", "version": sys.version_info[0]},
        "pygments_lexer": f"ipython{sys.version_info[0]}",
        "nbconvert_exporter": "python",
        "file_extension": ".py",
    }
