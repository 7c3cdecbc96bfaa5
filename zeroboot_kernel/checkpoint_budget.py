"""How much host memory a session's checkpoints may hold, and what the user is told about it.

Every kept checkpoint holds the pages its cell changed, so a notebook that rewrites 400 MB per cell
would keep 400 MB per checkpoint (issue 23: 3.8 GiB after 10 cells against 0.6 GiB under
ipykernel). The budget bounds that: when the checkpoints hold more, the oldest are dropped first;
the one the running (or next) cell rolls back to is always kept, because crash rollback needs it.

Default: as much as the notebook's own data (the guest memory in use), at least 256 MiB so that
ordinary notebooks keep all their checkpoints, at most 1/8 of the host's RAM. A notebook's memory
is then about twice what it needs under ipykernel at worst. `ZEROBOOT_CHECKPOINT_MEMORY` (in the
kernelspec's env) and `%sandbox checkpoints budget SIZE` set a fixed budget; `auto` restores the
default.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from .guest_memory_size import host_memory
from .sizes import parse_bytes

ENV = "ZEROBOOT_CHECKPOINT_MEMORY"
MIB = 1 << 20
FLOOR = 256 * MIB          # default budget never below this: small notebooks keep every checkpoint
HOST_SHARE = 8             # default budget never above 1/HOST_SHARE of the host's RAM


class BudgetSyntaxError(ValueError):
    """A budget was written in a way that is not a size."""


def parse_size(text: str) -> int | None:
    """'512M', '2GiB', '1.5g', '300000000' -> bytes (units are binary); 'auto' -> None (the default)."""
    if text.strip().lower() == "auto":
        return None
    size = parse_bytes(text)
    if size is None:
        raise BudgetSyntaxError(f"{text!r} is not a size: give a number with an optional unit K, M, G or T "
                                f"(binary, e.g. 512M or 2G), or auto for the default")
    return size


def from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The budget set in the environment, or None for the default. Raises BudgetSyntaxError."""
    raw = (os.environ if env is None else env).get(ENV, "").strip()
    if not raw:
        return None
    try:
        return parse_size(raw)
    except BudgetSyntaxError as exc:
        raise BudgetSyntaxError(f"{ENV}={raw!r}: {exc}") from None


def default_budget(guest_bytes: int, host_bytes: int | None = None) -> int:
    """The budget when none is set: the notebook's own data, within [FLOOR, host RAM / HOST_SHARE]."""
    cap = (host_bytes if host_bytes is not None else host_memory() or 8 << 30) // HOST_SHARE  # 8 GiB: unknown
    return max(min(FLOOR, cap), min(cap, guest_bytes))


def mib(n: int) -> str:
    return f"{n / MIB:,.0f} MiB" if n >= 10 * MIB else f"{n / MIB:.1f} MiB"
