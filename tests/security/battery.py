"""Helpers of the escape battery (tests/security/): run the guest programs of guest/ and read
their "ATTEMPT name ok|err detail" lines."""
from __future__ import annotations

from pathlib import Path

import guest_c
from zeroboot_kernel.native import EventKind

GUEST_SOURCES = Path(__file__).resolve().parent / "guest"


def run(name: str, *args: str, **kw) -> guest_c.GuestRun:
    return guest_c.run(name, *args, sources=GUEST_SOURCES, **kw)


def boot(name: str, *args: str, **kw):
    return guest_c.boot(name, *args, sources=GUEST_SOURCES, **kw)


def attempts(result: guest_c.GuestRun) -> dict[str, tuple[str, str]]:
    """name -> ("ok", first bytes read) or ("err", "ENOENT")."""
    out: dict[str, tuple[str, str]] = {}
    for line in result.out.splitlines():
        if line.startswith("ATTEMPT "):
            parts = line.split(" ", 3)
            out[parts[1]] = (parts[2], parts[3] if len(parts) > 3 else "")
    return out


def completed(result: guest_c.GuestRun, test: str) -> None:
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert f"PASS {test}" in result.out, result.describe()


def engine_still_works() -> None:
    """A fresh sandbox on the same engine (and executor VM) runs normally."""
    guest_c.check("process", "identity")
