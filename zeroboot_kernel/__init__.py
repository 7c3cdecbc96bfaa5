"""zeroboot-kernel: a Jupyter kernel whose every cell runs in its own KVM virtual machine."""

__version__ = "0.1.0"
