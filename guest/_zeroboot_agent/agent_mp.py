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
- The 'forkserver' start method works as on the host: its server is a process started like a
  spawn child, and each new process's fds reach it over its AF_UNIX socket with SCM_RIGHTS
  (native/sys_socket.c). Its server lives until the interpreter exits, like the host's: a child
  process, which checkpoints leave out (a rollback ends it, and multiprocessing starts a new one
  when it next needs it), while the notebook's end of its socket is held like any open file.
"""
from __future__ import annotations

import os
from typing import Any

from .agent_after_import import when_imported


def install() -> None:
    """Apply the adaptations: now for the modules the agent has imported, at first import for the
    others (so the template does not import what no cell asked for)."""
    try:
        from multiprocessing import resource_tracker
    except ImportError:  # a Python built without _multiprocessing
        return
    _null_tracker(resource_tracker)
    when_imported({
        "joblib.externals.loky.backend.resource_tracker": _null_tracker,
        "loky.backend.resource_tracker": _null_tracker,
    })


def _null_tracker(module: Any) -> None:
    """Give a resource-tracker module's tracker /dev/null as its pipe, if it has not started."""
    tracker = getattr(module, "_resource_tracker", None)
    if tracker is not None and getattr(tracker, "_fd", None) is None and getattr(tracker, "_pid", None) is None:
        tracker._fd = os.open(os.devnull, os.O_WRONLY)
