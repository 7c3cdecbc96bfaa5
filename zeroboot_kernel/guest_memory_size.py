"""How much memory a notebook's sandbox gets.

Under ipykernel a notebook may use the host's memory; the sandbox has a fixed guest memory (mapped
up front by the template, docs/ARCHITECTURE.md), so its size follows the host: the smaller of the
host's RAM and a cap (DEFAULT_CAP), unless ZEROBOOT_MEMORY says otherwise. Within that size a
session's limit can be lowered or raised again with `%sandbox memory SIZE`; beyond it the template
must be built bigger (ZEROBOOT_MEMORY in the kernelspec's env, then restart the kernel).

    ZEROBOOT_MEMORY  guest memory size: 8G, 8GiB, 6144M, ... (a bare number is MiB)
"""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from .errors import ZerobootError
from .sizes import parse_bytes

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_CAP = 4 * GIB     # per-page bookkeeping and dirty logging grow with the guest's size
MINIMUM = 512 * MIB       # the template alone holds ~450 MiB with numpy, pandas and matplotlib
MAXIMUM = 64 * GIB        # the engine's limit (ZB_MEM_MAX)
ALIGN = 2 * MIB           # guest memory is mapped in 2 MiB pages



class MemorySizeError(ZerobootError):
    """A memory size the sandbox cannot have."""


def parse_size(text: str, what: str = "ZEROBOOT_MEMORY") -> int:
    """Bytes for '8G', '8GiB', '6144M', '6144' (MiB); aligned to 2 MiB and range-checked."""
    size = parse_bytes(text, bare_unit=MIB)
    if size is None:
        raise MemorySizeError(f"{what}={text!r}: give a size such as 4G, 8GiB or 6144M")
    size = (size + ALIGN - 1) // ALIGN * ALIGN
    if not MINIMUM <= size <= MAXIMUM:
        raise MemorySizeError(f"{what}={text!r}: the sandbox's memory must be between {MINIMUM // MIB} MiB "
                              f"and {MAXIMUM // GIB} GiB")
    return size


@functools.cache
def host_memory() -> int:
    """The host's RAM in bytes (MemTotal), or 0 if unknown. Read once: the checkpoint budget asks
    for it twice per chained cell, and reading /proc/meminfo costs ~0.1 ms each time."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def default_memory(env: Mapping[str, str] | None = None) -> int:
    """The template's guest memory: ZEROBOOT_MEMORY, else min(host RAM, DEFAULT_CAP)."""
    env = os.environ if env is None else env
    setting = (env.get("ZEROBOOT_MEMORY") or "").strip()
    if setting:
        return parse_size(setting)
    host = host_memory() or DEFAULT_CAP
    return max(MINIMUM, min(host, DEFAULT_CAP) // ALIGN * ALIGN)


def describe(size: int) -> str:
    return f"{size / GIB:.1f} GiB" if size >= GIB else f"{size // MIB} MiB"
