"""multiprocessing in the sandbox: what the agent adapts before the first cell (issue 15).

- Resource trackers are no process. On the host, the first `shared_memory.SharedMemory` (or a pool
  under the spawn start method) starts multiprocessing's resource tracker, a process that lives
  until the interpreter exits, to unlink the named shared memory and semaphores a program leaked;
  joblib's loky starts its own (a subclass that also refcounts joblib's memmapped arguments). In
  the sandbox a live process between cells means the cells have no checkpoint of their own
  (process trees are not snapshotted), for a helper that guards nothing: the sandbox's /dev/shm,
  with every name in it, ends with the sandbox, and a rollback restores it with the rest. So each
  tracker's pipe is /dev/null before its first use: registrations (of this process, its fork
  children, and the spawn children it hands the fd to) go nowhere and no tracker process starts.
  What differs from the host: no "leaked shared_memory objects" warning at exit, and a memmap
  joblib handed to loky's workers is unlinked with joblib's temporary folder at the end of the
  Parallel call (joblib deletes it then), not earlier by the tracker's refcount.
- AF_UNIX socket files (bind/listen/accept/connect on a path, SCM_RIGHTS fd passing) are not built
  yet (native/sys_socket.c: only socketpair()), so what needs them says so: the 'forkserver' start
  method is a ValueError from get_context/set_start_method (multiprocessing's own answer where a
  method is missing), and a `multiprocessing.connection.Listener` on AF_UNIX, a `Manager()` or a
  `SharedMemoryManager` is a PermissionError that names the reason (raised in the calling process,
  not as a server child's traceback followed by EOFError).
"""
from __future__ import annotations

import errno
import os
import sys
from typing import Any, Callable

UNIX_SOCKETS = ("the sandbox has no AF_UNIX socket files yet (bind/listen/accept on a path, fds "
                "passed with SCM_RIGHTS; only socketpair() works)")
FORKSERVER_UNAVAILABLE = (f"the 'forkserver' start method is not available in the sandbox: its server "
                          f"listens on an AF_UNIX socket, and {UNIX_SOCKETS}. Use the default 'fork' "
                          f"start method, or 'spawn'.")
LISTENER_UNAVAILABLE = (f"{UNIX_SOCKETS}, which multiprocessing's Listener, Manager() and "
                        f"SharedMemoryManager listen on. Share data with multiprocessing.Queue, Pipe, "
                        f"Value/Array or shared_memory (they work), or pass results back from a Pool.")


def install() -> None:
    """Apply the adaptations: now for the modules the agent has imported, at first import for the
    others (a meta-path hook, so the template does not import what no cell asked for)."""
    try:
        from multiprocessing import context, resource_tracker
    except ImportError:  # a Python built without _multiprocessing
        return
    _null_tracker(resource_tracker)
    _refuse_forkserver(context)
    hook = _AfterImport({
        "joblib.externals.loky.backend.resource_tracker": _null_tracker,
        "loky.backend.resource_tracker": _null_tracker,
        "multiprocessing.connection": _refuse_unix_listener,
        "multiprocessing.managers": _refuse_unix_manager,
    })
    for name in list(hook.callbacks):
        module = sys.modules.get(name)
        if module is not None:
            hook.callbacks.pop(name)(module)
    sys.meta_path.insert(0, hook)


def _null_tracker(module: Any) -> None:
    """Give a resource-tracker module's tracker /dev/null as its pipe, if it has not started."""
    tracker = getattr(module, "_resource_tracker", None)
    if tracker is not None and getattr(tracker, "_fd", None) is None and getattr(tracker, "_pid", None) is None:
        tracker._fd = os.open(os.devnull, os.O_WRONLY)


def _refuse_forkserver(context: Any) -> None:
    forkserver = getattr(context, "ForkServerContext", None)
    if forkserver is None:
        return

    def _check_available(self: object) -> None:
        raise ValueError(FORKSERVER_UNAVAILABLE)

    forkserver._check_available = _check_available


def _refuse_unix_listener(connection: Any) -> None:
    listener = getattr(connection, "SocketListener", None)
    if listener is None:
        return
    original = listener.__init__

    def __init__(self: object, address: object, family: str, *args: object, **kwargs: object) -> None:
        if family == "AF_UNIX":
            raise PermissionError(errno.EACCES, LISTENER_UNAVAILABLE)
        original(self, address, family, *args, **kwargs)

    listener.__init__ = __init__


def _refuse_unix_manager(managers: Any) -> None:
    base = getattr(managers, "BaseManager", None)
    connection = sys.modules.get("multiprocessing.connection")
    if base is None or connection is None:
        return
    original = base.start

    def start(self: Any, *args: object, **kwargs: object) -> None:
        address = getattr(self, "_address", None)
        family = connection.address_type(address) if address is not None else connection.default_family
        if family == "AF_UNIX":
            raise PermissionError(errno.EACCES, LISTENER_UNAVAILABLE)
        original(self, *args, **kwargs)

    base.start = start


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
