"""`%rewind` and `%sandbox` in batch execution: what the kernel does for them (kernel.py's
_magic_* methods), over the same engine requests and with the same texts (magics.py's formatters),
so notebooks written for the zeroboot kernel run unchanged under `zeroboot-kernel execute`.

The one magic left out is `%sandbox export`: it writes host files from the kernel process, and a
batch run writes nothing but the executed notebooks; it is a UsageError saying so.
"""
from __future__ import annotations

from typing import Any

from . import engine_requests as req
from . import listing
from . import magics as mg
from .engine_client import EngineClient
from .guest_memory_size import parse_size
from .project_root import ProjectRootError, find_project_root


class MagicFailed(Exception):
    """The engine refused a magic: shown as an error of the cell, named as the engine named it."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename = ename
        self.evalue = evalue


class BatchMagics:
    """The kernel-side state a notebook's magics change (mode, cell timeout, output policy)."""

    def __init__(self, client: EngineClient, *, mode: str, timeout: float | None, notebook_dir: str,
                 outputs: str = "trusted") -> None:
        self.client = client
        self.mode = mode
        self.cell_timeout = timeout
        self.timeout_changed = False   # a %sandbox timeout replaced the batch's --timeout
        self.outputs = outputs
        self.notebook_dir = notebook_dir

    def run(self, magic: mg.Magic) -> str:
        """Run one magic; returns what it prints (MagicFailed, mg.MagicUsageError otherwise)."""
        if isinstance(magic, mg.Rewind):
            return str(self._call(req.REWIND, n=magic.n).get("text", "")) + "\n"
        sub = magic.sub
        if sub == "help":
            return mg.HELP
        if sub == "mode":
            if magic.arg is None:
                return f"{self.mode} mode (switch with `%sandbox mode chained|isolated`)\n"
            text = self._call(req.MODE, mode=magic.arg).get("text", "")
            self.mode = magic.arg
            return f"{text}\n"
        if sub == "timeout":
            if magic.arg is not None:
                self._call(req.TIMEOUT, seconds=magic.seconds)
                self.cell_timeout = magic.seconds or None
                self.timeout_changed = True
            return f"cell timeout: {self._timeout_text()}\n"
        if sub == "memory":
            if magic.arg is not None:
                return str(self._call(req.MEMORY, bytes=parse_size(magic.arg, "%sandbox memory")).get("text", "")) + "\n"
            stats = self._stats()
            return (f"sandbox memory: {stats.get('guest_memory_mib')} MiB in use of a "
                    f"{stats.get('guest_memory_limit_mib')} MiB limit (change with `%sandbox memory SIZE`; "
                    f"ZEROBOOT_MEMORY sets the most it can be)\n")
        if sub == "checkpoints":
            if magic.arg == "budget":
                return str(self._call(req.CHECKPOINT_BUDGET, size=magic.dest).get("text", "")) + "\n"
            got = self._call(req.CHECKPOINTS)
            return mg.format_checkpoints(got.get("checkpoints") or [], self.mode, got.get("budget"))
        if sub == "stats":
            return mg.format_stats(self._stats(), {"timeout": self._timeout_text(), "round_trip_ms_p50": None,
                                                   "engine_pid": self.client.proc.pid})
        if sub == "files":
            if magic.arg is None:
                return mg.format_files(self._stats().get("files") or {})
            return str(self._call(req.FILES, mode=magic.arg).get("text", "")) + "\n"
        if sub == "diff":
            got = self._call(req.DIFF)
            more = got.get("more")
            return mg.format_diff(_checked_changes(got.get("changes")), self._project_root(),
                                  more if type(more) is int and more > 0 else 0)
        if sub == "outputs":
            if magic.arg is not None:
                self.outputs = magic.arg
            return {"trusted": "outputs: trusted (HTML and JavaScript from cells reach the browser as they are)\n",
                    "safe": "outputs: safe (JavaScript dropped; HTML and Markdown sanitised)\n"}[self.outputs]
        if sub == "reset":
            self._call(req.RESTART)
            return ("the sandbox is back to the clean template state; every checkpoint was dropped "
                    f"({self.mode} mode)\n")
        if sub == "export":
            raise mg.MagicUsageError("%sandbox export writes host files, which `zeroboot-kernel execute` does not: "
                                     "run the notebook in the kernel to export, or write results as outputs")
        if sub in ("save", "resume", "saves"):
            raise mg.MagicUsageError(f"%sandbox {sub}: session saves belong to a kernel's session; `zeroboot-kernel "
                                     "execute` runs every notebook in a fresh sandbox and keeps no saves")
        if sub == "network":  # batch engines start without a policy (engine_server --network)
            return "network: none (`zeroboot-kernel execute` runs notebooks without network egress)\n"
        raise mg.MagicUsageError(f"unhandled %sandbox subcommand {magic!r}")

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        content = self.client.call(op, **fields)
        if content.get("status") != "ok":
            raise MagicFailed(str(content.get("ename") or "SandboxError"),
                              str(content.get("evalue") or f"the engine could not do {op!r}"))
        return content

    def _stats(self) -> dict[str, Any]:
        stats = self._call(req.STATS).get("stats")
        return stats if isinstance(stats, dict) else {}

    def _timeout_text(self) -> str:
        return f"{self.cell_timeout:g} s" if self.cell_timeout else "none"

    def _project_root(self) -> str:
        try:
            return find_project_root(self.notebook_dir)
        except ProjectRootError:
            return self.notebook_dir


def _checked_changes(changes: Any) -> list[list[str]]:
    """The engine's diff, checked as the kernel checks it: [tag, relative path] pairs."""
    if not isinstance(changes, list) or not all(
            isinstance(c, list) and len(c) == 2 and c[0] in listing.TAGS.values() and isinstance(c[1], str)
            for c in changes):
        raise MagicFailed("SandboxError", "the engine's diff was malformed")
    return changes
