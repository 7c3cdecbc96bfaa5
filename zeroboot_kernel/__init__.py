"""zeroboot-kernel: a Jupyter kernel whose every cell runs in its own KVM virtual machine."""

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]),
# templates are keyed by it, and tests/test_packaging.py checks that the two agree.
__version__ = "0.1.0"
