"""Stream output batched into IOPub messages the way ipykernel batches it.

ipykernel's OutStream buffers what a cell prints and sends it FLUSH_INTERVAL (0.2 s) after the
first write, or earlier when something else is published (display data, a result, an error, an
input request, the reply): `print(array)` is one stream message, not "[[...]]" and then "\\n".
Clients store each stream message as it comes (nbclient without coalesce_streams writes one output
per message), so the number of messages shows in saved notebooks. The guest sends its output in
frames timed for latency, not for this; the kernel re-batches here, with a timer thread so that
progress output still appears while a long cell runs.
"""
from __future__ import annotations

import threading
from typing import Callable

FLUSH_INTERVAL = 0.2  # ipykernel's OutStream.flush_interval
STREAMS = ("stdout", "stderr")


class StreamBatcher:
    """Collects stream text and hands it to `publish(name, text)` as ipykernel would send it."""

    def __init__(self, publish: Callable[[str, str], None], interval: float = FLUSH_INTERVAL) -> None:
        self._publish = publish
        self._interval = interval
        self._lock = threading.Lock()
        self._pending: dict[str, list[str]] = {name: [] for name in STREAMS}
        self._timer: threading.Timer | None = None

    def write(self, name: str, text: str) -> None:
        if not text:
            return
        if name not in self._pending:
            name = "stdout"
        with self._lock:
            self._pending[name].append(text)
            if self._timer is None:
                self._timer = threading.Timer(self._interval, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Publish everything pending now (stdout, then stderr, as ipykernel's explicit flushes)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            # publish under the lock: a timer flush and an explicit one must not reorder output
            for name in STREAMS:
                parts = self._pending[name]
                if parts:
                    text = "".join(parts)
                    parts.clear()
                    self._publish(name, text)
