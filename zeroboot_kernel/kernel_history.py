"""The kernel's own record of executed cells, answering history_request (tail, range, search).

The guest cannot keep history: in isolated mode every cell starts from the template, and a
rollback or %rewind would erase it. The kernel process is the only place that sees every cell.
Entries follow IPython's HistoryManager: (session, line, input) or (session, line, (input,
output)) with line = the cell's execution count. There is one session: this kernel process.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

SESSION = 1


@dataclass
class Entry:
    line: int
    source: str
    output: str | None = None


class CellHistory:
    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def record(self, line: int, source: str) -> Entry:
        entry = Entry(line, source)
        self.entries.append(entry)
        return entry

    # ---- history_request ----
    def tail(self, n: int | None, output: bool = False) -> list[tuple[Any, ...]]:
        picked = self.entries if n is None else self.entries[-n:] if n > 0 else []
        return [self._row(e, output) for e in picked]

    def range(self, session: int | None, start: int | None, stop: int | None,
              output: bool = False) -> list[tuple[Any, ...]]:
        """Lines start <= line < stop of a session; session 0/None means this one, as in IPython
        (negative numbers would be earlier sessions, which a fresh kernel process does not have)."""
        if session not in (None, 0, SESSION):
            return []
        lo = start if start is not None else 1
        return [self._row(e, output) for e in self.entries if e.line >= lo and (stop is None or e.line < stop)]

    def search(self, pattern: str | None, n: int | None = None, unique: bool = False,
               output: bool = False) -> list[tuple[Any, ...]]:
        """Glob search over the sources (like IPython's sqlite GLOB: whole source, case sensitive);
        the last n matches, oldest first; unique keeps the latest entry of each source."""
        regex = re.compile(fnmatch.translate(pattern or "*"), re.DOTALL)
        matches = [e for e in self.entries if regex.match(e.source)]
        if unique:
            latest: dict[str, Entry] = {}
            for e in matches:
                latest.pop(e.source, None)  # re-insert so the order is by latest occurrence
                latest[e.source] = e
            matches = list(latest.values())
        if n is not None:
            matches = matches[-n:] if n > 0 else []
        return [self._row(e, output) for e in matches]

    @staticmethod
    def _row(e: Entry, output: bool) -> tuple[Any, ...]:
        return (SESSION, e.line, (e.source, e.output) if output else e.source)

    def reply(self, hist_access_type: str, output: bool = False, session: int | None = None,
              start: int | None = None, stop: int | None = None, n: int | None = None,
              pattern: str | None = None, unique: bool = False, **_: Any) -> dict[str, Any]:
        if hist_access_type == "tail":
            rows = self.tail(n, output)
        elif hist_access_type == "range":
            rows = self.range(session, start, stop, output)
        elif hist_access_type == "search":
            rows = self.search(pattern, n, unique, output)
        else:
            return {"status": "error", "ename": "ValueError", "traceback": [],
                    "evalue": f"unknown hist_access_type {hist_access_type!r}: use tail, range or search",
                    "history": []}
        return {"status": "ok", "history": rows}
