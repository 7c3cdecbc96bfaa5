"""Exceptions raised by the engine binding and the kernel. Each carries an actionable message."""
from __future__ import annotations


class ZerobootError(Exception):
    """Base class of everything this package raises on purpose."""


class KvmUnavailableError(ZerobootError):
    """/dev/kvm is missing or not accessible: nothing can run."""


class SandboxError(ZerobootError):
    """A sandbox could not be created or broke a rule (bad I/O port, malformed frame, ...)."""


class SandboxCrashed(SandboxError):
    """The guest program crashed (segfault, illegal instruction, abort, ...)."""

    def __init__(self, message: str, signal: int = 0, rip: int = 0) -> None:
        super().__init__(message)
        self.signal = signal
        self.rip = rip


class ChannelError(SandboxError):
    """The cell channel's self-check failed: frames of a request were lost, duplicated or
    reordered, or its output did not all arrive. The cell's result cannot be trusted."""


class SandboxTimeout(SandboxError):
    """The guest ran past its deadline and was stopped; after_interrupt: the deadline was an
    interrupt's grace period (the cell was interrupted and did not stop in time)."""

    def __init__(self, message: str, *, after_interrupt: bool = False) -> None:
        super().__init__(message)
        self.after_interrupt = after_interrupt


class SandboxMemoryError(SandboxError):
    """The guest needed more memory than its cap allows."""


class TemplateError(ZerobootError):
    """A template is missing, stale or corrupt; rebuilding it fixes this."""
