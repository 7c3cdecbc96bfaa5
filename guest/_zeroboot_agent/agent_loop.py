"""The asyncio event loop the agent serves its requests in, as ipykernel runs every cell inside its
kernel's running loop (docs/ARCHITECTURE.md, "The agent's event loop").

What a notebook sees, as under ipykernel: `asyncio.get_running_loop()` in a cell is the loop, and
`asyncio.create_task` / `ensure_future` work; tasks and timers a cell leaves behind run between
cells; a cell with top-level `await` runs as a task of the loop, and an interrupt cancels it
(CancelledError); `asyncio.run()` and `loop.run_until_complete()` raise RuntimeError in a cell.

Waiting for the next request is the host's idle point: a blocking read of the UART, with which
the engine stops the run (the guest costs nothing until a request comes). So while the loop has
nothing to do, the agent waits exactly that way. When it has work (ready callbacks, timers,
watched files), it first polls the UART with a timeout: the engine sees a wait for input that
ends by itself and, between cells, lets the guest run until the next request (zb_wait_input);
then it waits inside the loop with the UART as one of its readers, so tasks run until a request
arrives, as they run in ipykernel's kernel. With other threads alive, which may wake the loop,
the first wait also watches the loop's wake-up socket.
"""
from __future__ import annotations

import asyncio
import select
import threading
from collections.abc import Coroutine
from typing import Any
# User code may replace builtins (`builtins.len = ...`); the agent's own code must not follow,
# so the builtins it uses are bound as this module's globals.
from builtins import bool, getattr, int, len, list  # noqa: A004

from . import agent_io as aio
from .agent_io import log

# The first wait of a loop with work to do: long enough to be a wait (a poll with timeout 0 never
# stops the run, so the host would not see the agent waiting), short enough not to delay a task.
FIRST_WAIT_MS = 1


class AgentLoop:
    """The agent's event loop: made before the template is taken, so every fork has it."""

    def __init__(self, channel: aio.Channel, gate: aio.InterruptGate) -> None:
        self.channel = channel
        self.gate = gate
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self._cell_task: asyncio.Task[Any] | None = None

    def run(self, main: Coroutine[Any, Any, int]) -> int:
        """Run the agent's request loop (a coroutine) until it returns. A KeyboardInterrupt or
        SystemExit that a background task raised (a task's step re-raises them) ends only that
        task: ipykernel's kernel would go on serving requests, and so does the agent; so does a
        cell that stopped the running loop (`loop.stop()`: the loop just runs on)."""
        task = self.loop.create_task(main)
        while True:
            try:
                return self.loop.run_until_complete(task)
            except (KeyboardInterrupt, SystemExit, RuntimeError) as exc:
                if task.done() or self.loop.is_closed():
                    raise
                log(f"{type(exc).__name__} ({aio.safe_str(exc)}) outside the agent's requests; the agent goes on")

    # ---- waiting for the next request -----------------------------------------------------

    def has_work(self) -> bool:
        """The loop has something to run before the next request: ready callbacks, a live timer,
        or a file it watches besides its own wake-up socket (another thread's call_soon_threadsafe
        is wait_for_request's to watch). Read from the loop's internals (CPython's
        BaseEventLoop): if they are not there, the agent waits as if it had none."""
        loop = self.loop
        ready = getattr(loop, "_ready", None)
        scheduled = getattr(loop, "_scheduled", None)
        selector = getattr(loop, "_selector", None)
        if ready is None or scheduled is None or selector is None:
            return False
        if ready:
            return True
        for timer in scheduled:
            if not timer.cancelled():
                return True
        return len(selector.get_map()) > 1  # the loop's wake-up socket is always there

    def _wake_up_fds(self) -> list[int]:
        """The loop's own wake-up socket (what call_soon_threadsafe writes to), as the selector
        has it registered, or none if the loop's internals are not there."""
        selector = getattr(self.loop, "_selector", None)
        return list(selector.get_map()) if selector is not None else []

    async def wait_for_request(self) -> None:
        """Return once the next request's bytes can be read from the UART (or it is closed),
        running the loop's tasks meanwhile if it has any, or once another thread wakes it."""
        if self.has_work():
            first_wait, watched = FIRST_WAIT_MS, [self.channel.fd]
        elif threading.active_count() > 1:
            # another thread may wake the loop (call_soon_threadsafe) while the agent waits: a
            # wait without end on the UART and the loop's wake-up socket (the engine runs the
            # threads meanwhile, as the UART read lets them)
            first_wait, watched = -1, [self.channel.fd, *self._wake_up_fds()]
        else:
            return  # the caller's blocking read is the wait
        poller = select.poll()
        for fd in watched:
            poller.register(fd, select.POLLIN)
        ready = [fd for fd, _ in poller.poll(first_wait)]
        if self.channel.fd in ready:
            if self.has_work():
                await asyncio.sleep(0)  # what is ready runs first, as in ipykernel's loop
            return
        readable = self.loop.create_future()

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        self.loop.add_reader(self.channel.fd, on_readable)
        try:
            await readable
        finally:
            self.loop.remove_reader(self.channel.fd)

    # ---- cells with top-level await -------------------------------------------------------

    async def run_cell_task(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a cell's coroutine (IPython's run_cell_async) as a task of the loop, as ipykernel
        does: an interrupt while the loop waits (the cell awaits something) cancels that task, and
        the cell ends with CancelledError as under ipykernel; one while the cell's own code runs
        raises KeyboardInterrupt there as in any cell."""
        task = self.loop.create_task(coro)
        self._cell_task = task
        self.gate.elsewhere = self._interrupt_elsewhere
        try:
            return await task
        finally:
            self.gate.elsewhere = None
            self._cell_task = None

    def _interrupt_elsewhere(self) -> bool:
        """For the gate's SIGINT handler while a cell task runs: True if the interrupt was taken
        by cancelling the cell (the loop is waiting, or another task runs), False if the cell's
        own code runs and the interrupt is raised there."""
        task = self._cell_task
        if task is None or task.done():
            return False
        if asyncio.current_task(self.loop) is task:
            return False
        # from a signal handler: call_soon_threadsafe also wakes the loop's wait
        self.loop.call_soon_threadsafe(task.cancel)
        return True

