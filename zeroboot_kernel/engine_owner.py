"""The thread that starts the kernel's sandbox engine process and watches it (EngineOwner), and
the early start that kernel_launch.py makes before the kernel's own imports (take_early).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import select
import sys
import threading
import time
from typing import Any, Callable

from . import session_save
from .engine_client import EngineClient, EngineDied
from .kernel_config import KernelSettings

log = logging.getLogger(__name__)

# An engine that dies while starting, without a reason, gets one more try.
START_ATTEMPTS = 2


class MagicFailed(Exception):
    """An engine request answered with an error (a magic's, session_save's)."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename = ename
        self.evalue = evalue


def checked_call(client: EngineClient) -> Callable[..., dict[str, Any]]:
    """client.call that raises the engine's error reply (for session_save's kernel side)."""
    def call(op: str, **fields: Any) -> dict[str, Any]:
        content = client.call(op, **fields)
        if content.get("status") != "ok":
            raise MagicFailed(str(content.get("ename") or "SandboxError"),
                              str(content.get("evalue") or f"the engine could not do {op!r}"))
        return content
    return call


def kernel_arguments() -> tuple[str, ...]:
    """This kernel process's arguments (the kernelspec's `-f {connection_file}`): the guest's
    sys.argv[1:], as a notebook under ipykernel_launcher sees them."""
    return tuple(sys.argv[1:])


class EngineOwner(threading.Thread):
    """Starts the engine process and lives as long as it does.

    The engine arms PR_SET_PDEATHSIG so that it dies with the kernel; Linux sends that signal when
    the *thread* that spawned the process exits, not the process. Spawning from an executor thread
    would kill the engine whenever the pool retires that thread, and spawning from the main thread
    would block the kernel while a template is built. So one thread spawns it, then stays to
    watch it (pidfd) and report an unexpected exit.
    """

    def __init__(self, settings: KernelSettings, notebook_dir: str) -> None:
        super().__init__(name="zeroboot-engine-owner", daemon=True)
        self.settings = settings
        self.notebook_dir = notebook_dir
        self.log = log  # the kernel's, once it adopts this owner
        self._on_exit: Callable[[str], None] | None = None
        self._exit_reason: str | None = None  # an exit before the kernel adopted this owner
        self._adopt_lock = threading.Lock()
        self.future: concurrent.futures.Future[EngineClient] = concurrent.futures.Future()
        self.closing = threading.Event()
        self.startup_note: str | None = None  # ZEROBOOT_RESUME / autosave: said with the first output

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            client = self._start()
        except BaseException as exc:  # noqa: BLE001 - reported to the first request
            self.log.error("zeroboot: the sandbox engine did not start: %s", exc)
            self.future.set_exception(exc)
            return
        self.log.info("zeroboot: sandbox engine ready in %.2f s (pid %d, template %s)",
                      time.monotonic() - t0, client.proc.pid, client.info.get("template"))
        self.startup_note = session_save.startup_resume(checked_call(client), self.notebook_dir)
        self.future.set_result(client)
        self._watch(client)

    def adopt(self, kernel_log: logging.Logger, on_exit: Callable[[str], None]) -> None:
        """The kernel takes this owner: its log from now on, and on_exit(reason) for an unexpected
        exit of the engine (at once if it has already happened)."""
        with self._adopt_lock:
            self.log = kernel_log
            self._on_exit = on_exit
            reason, self._exit_reason = self._exit_reason, None
        if reason is not None:
            on_exit(reason)

    def start_once(self) -> None:
        """Start the thread unless it has been started: an early owner's may even have ended
        already (its engine failed to start), and a thread cannot be started twice."""
        if self.ident is None:
            self.start()

    def _exited(self, reason: str) -> None:
        with self._adopt_lock:
            on_exit = self._on_exit
            if on_exit is None:
                self._exit_reason = reason
        if on_exit is not None:
            on_exit(reason)

    def _start(self) -> EngineClient:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                # The engine logs only while it has to build the template (first start, or after
                # an upgrade): seconds of waiting worth seeing at the kernel's default log level.
                # Jupyter starts a kernel in the notebook's folder: the guest sees it at the same
                # path and starts there, so relative paths in the notebook work unchanged.
                return EngineClient(template=self.settings.template, mode=self.settings.mode,
                                    timeout=self.settings.cell_timeout, checkpoints=self.settings.checkpoints,
                                    project=self.notebook_dir, files=self.settings.files,
                                    hidden=self.settings.hidden,
                                    network=self.settings.network.to_wire() if self.settings.network.enabled else None,
                                    on_log=lambda text: self.log.warning("zeroboot: %s", text),
                                    live_output=True, argv=kernel_arguments())  # threads' output between cells (_publish_idle_output)
            except EngineDied as exc:
                # The process vanished without saying why (a ZerobootError, e.g. no /dev/kvm or a
                # broken template, arrives as a "fatal" message instead and is not retried).
                if attempt == START_ATTEMPTS:
                    raise
                self.log.warning("zeroboot: the sandbox engine died while starting (%s); starting it again", exc)
        raise AssertionError("unreachable")

    def start_worker(self) -> EngineClient:
        """A %%fanout --jobs worker engine (fanout_jobs.py): started as the kernel's own engine is
        (the same confinement, notebook folder, files mode, network policy), without live output."""
        return EngineClient(template=self.settings.template, mode="chained", timeout=self.settings.cell_timeout,
                            checkpoints=1, project=self.notebook_dir, files=self.settings.files,
                            hidden=self.settings.hidden,
                            network=self.settings.network.to_wire() if self.settings.network.enabled else None,
                            on_log=lambda text: self.log.info("zeroboot: fan-out worker: %s", text),
                            argv=kernel_arguments())

    def _watch(self, client: EngineClient) -> None:
        try:
            fd = os.pidfd_open(client.proc.pid)
        except (OSError, AttributeError):
            self.closing.wait()  # no pidfd: stay alive (see above); death shows at the next request
            return
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        if not self.closing.is_set():
            code = client.proc.poll()
            if code is None:
                status = "unknown status"
            else:
                status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            self._exited(f"the sandbox engine process (pid {client.proc.pid}) exited ({status})")


# The owner kernel_launch.py started before the kernel existed (one per process).
_early: EngineOwner | None = None


def start_early(settings: KernelSettings, notebook_dir: str) -> None:
    """Start the engine now, for the kernel this process is about to create: its start (~0.4 s)
    then runs beside the kernel's imports and set-up (~0.3-0.6 s) instead of after them."""
    global _early
    owner = EngineOwner(settings, notebook_dir)
    owner.start()
    _early = owner


def take_early(settings: KernelSettings, notebook_dir: str) -> EngineOwner | None:
    """The early owner, if it was started for these settings and this folder (else None, and the
    kernel starts its own; an early engine for other settings is closed)."""
    global _early
    owner, _early = _early, None
    if owner is None:
        return None
    if owner.settings == settings and owner.notebook_dir == notebook_dir:
        return owner
    log.warning("zeroboot: the engine started early was for other settings; starting another")
    owner.closing.set()
    owner.future.add_done_callback(_close_client)
    return None


def _close_client(future: concurrent.futures.Future[EngineClient]) -> None:
    if future.exception() is None:
        future.result().close(timeout=0.5)
