"""zeroboot-kernel: a Jupyter kernel whose every cell runs in its own KVM virtual machine."""
from typing import Any

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]),
# templates are keyed by it, and tests/test_packaging.py checks that the two agree.
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # zeroboot_kernel.execute_notebooks (batch.py), imported on first use: `import zeroboot_kernel`
    # stays cheap for the kernel and the engine process
    if name == "execute_notebooks":
        from .batch import execute_notebooks
        return execute_notebooks
    raise AttributeError(f"module 'zeroboot_kernel' has no attribute {name!r}")
