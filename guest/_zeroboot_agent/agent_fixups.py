"""Settings the agent gives libraries when they are imported, where a library's default needs
something the sandbox cannot give and would warn about it on every first use.

- tqdm starts a monitor thread with its first bar (it refreshes bars that stalled); the sandbox
  cannot start threads, so tqdm warned "TqdmMonitorWarning: tqdm:disabling monitor support
  (monitor_interval = 0) due to: can't start new thread" under every first progress bar (also
  tqdm.notebook's). The agent sets `tqdm.monitor_interval = 0` as the module is imported, which is
  what tqdm does itself after that warning.

Nothing is imported ahead of the user: a meta path finder waits for the module's import and runs
the setting right after the module's own code.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable, Sequence

from .agent_io import log


def _tqdm_without_monitor(module: ModuleType) -> None:
    module.tqdm.monitor_interval = 0


FIXUPS: dict[str, Callable[[ModuleType], None]] = {"tqdm.std": _tqdm_without_monitor}


class _FixupLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, fix: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.fix = fix

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.fix(module)
        except Exception as exc:  # noqa: BLE001 - another version of the library: leave it as it is
            log(f"fixup of {module.__name__}: {type(exc).__name__}: {exc}")


class FixupFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module of FIXUPS it asks the other finders and wraps the loader."""

    def __init__(self) -> None:
        self._finding: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        fix = FIXUPS.get(fullname)
        if fix is None or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _FixupLoader(spec.loader, fix)
        return spec


def install() -> None:
    sys.meta_path.insert(0, FixupFinder())
