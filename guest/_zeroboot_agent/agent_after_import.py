"""Adapt a module right after its first import, so the template does not import what no cell asked
for (agent_mp.py: multiprocessing's resource trackers; agent_stat_ahead.py: IPython's autoreload)."""
from __future__ import annotations

import sys
from typing import Any, Callable


def when_imported(callbacks: dict[str, Callable[[Any], None]]) -> None:
    """Run each callback on its module: now if it is imported, else right after its first import."""
    hook = _AfterImport(dict(callbacks))
    for name in list(hook.callbacks):
        module = sys.modules.get(name)
        if module is not None:
            hook.callbacks.pop(name)(module)
    if hook.callbacks:
        sys.meta_path.insert(0, hook)


class _AfterImport:
    """A meta-path finder that runs a callback on a module right after its first import."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        callback = self.callbacks.pop(name, None)
        if callback is None:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)  # type: ignore[arg-type]
        loader = spec.loader if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_adapt(module: Any) -> None:
            exec_module(module)
            callback(module)

        loader.exec_module = exec_then_adapt  # type: ignore[union-attr]
        return spec
