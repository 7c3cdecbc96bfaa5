"""Sizes as users write them in settings and magics: '512M', '2GiB', '1.5g', '4096'.

Units are binary (K = 1024). What a bare number means is the caller's choice, stated in its own
documentation: MiB for the sandbox's memory (ZEROBOOT_MEMORY), bytes for the checkpoint budget.
"""
from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str, bare_unit: int = 1) -> int | None:
    """Bytes for `text`, or None when it is not a size (the caller words the error)."""
    m = _SIZE.match(text or "")
    if not m:
        return None
    unit = m.group(2).lower()
    return int(float(m.group(1)) * (_UNITS[unit] if unit else bare_unit))
