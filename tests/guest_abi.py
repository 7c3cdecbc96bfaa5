"""Numbers of the guest ABI for the tests, read from its one copy (guest/guest_abi.h)."""
from __future__ import annotations

import re
from pathlib import Path

GUEST_ABI = Path(__file__).resolve().parents[1] / "guest" / "guest_abi.h"


def abi(name: str) -> int:
    """A number of the guest ABI (guest/guest_abi.h: `#define NAME 0x...` or decimal)."""
    m = re.search(rf"^#define {name} (0x[0-9a-f]+|[0-9]+)\b", GUEST_ABI.read_text(), re.M)
    assert m, name
    return int(m.group(1), 0)
