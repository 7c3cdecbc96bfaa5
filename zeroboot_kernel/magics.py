"""Kernel magics: `%rewind` and `%sandbox`, handled by the kernel process, never by the guest.

They act on the sandbox *around* the guest (its checkpoints, mode, time limit), so they cannot
run inside it: a cell's leading magic lines are split off here and run by the kernel; the rest of
the cell (if any) goes to the guest. A cell that is only magics never touches the guest.

    %rewind [N]                          state as before the last N cells (default 1)
    %sandbox mode [chained|isolated]     show or switch the execution mode
    %sandbox checkpoints                 the checkpoints %rewind can go back to, and their memory
    %sandbox checkpoints budget [SIZE|auto]  show or set the checkpoints' memory budget
    %sandbox stats                       fork/exec timings, memory of the live fork, template
    %sandbox timeout [SECONDS]           show or set the per-cell time limit (0 = none)
    %sandbox memory [SIZE]               show or set the sandbox's memory limit
    %sandbox reset                       back to a clean sandbox (drops every checkpoint)
    %sandbox files [overlay|readonly|readwrite]  what of the host is shown (the notebook's project), and how
    %sandbox diff                        what the sandbox changed in the notebook's folder
    %sandbox export PATH [DEST]          copy a file or folder from the sandbox to the host folder
    %sandbox outputs [trusted|safe]      show or set what rich outputs may do in the browser
    %sandbox network                     the network egress allow list (read-only: ZEROBOOT_NETWORK)
    %sandbox save [NAME|PATH]            save the session to a file (session_save.py)
    %sandbox resume NAME|PATH            replace the session by a save
    %sandbox saves                       list the saves
    %sandbox help                        this text
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Union

from .checkpoint_budget import BudgetSyntaxError, mib
from .checkpoint_budget import parse_size as parse_budget
from .guest_memory_size import MemorySizeError, parse_size
from .listing import printable

MAGIC_NAMES = ("rewind", "sandbox")
MODES = ("chained", "isolated")
FILES_MODES = ("overlay", "readonly", "readwrite")
OUTPUT_POLICIES = ("trusted", "safe")

HELP = """\
zeroboot kernel magics (run by the kernel, before the rest of the cell goes to the sandbox):

  %rewind [N]                        go back to the state before the last N cells (default 1)
  %sandbox mode [chained|isolated]   show or switch the mode:
                                       chained   each cell continues from the previous one
                                       isolated  each cell starts from a clean sandbox
  %sandbox checkpoints               list the checkpoints %rewind can return to, their memory,
                                     and how deep %rewind can go (and why)
  %sandbox checkpoints budget [SIZE] show or set the memory the checkpoints may hold (e.g. 2G;
                                     auto = the notebook's data, 256 MiB to 1/8 of host RAM);
                                     the oldest checkpoints are dropped first
  %sandbox stats                     fork/exec timings, memory of the live fork, template in use
  %sandbox timeout [SECONDS]         show or set the time limit per cell (0 = no limit)
  %sandbox memory [SIZE]             show or set the sandbox's memory limit (2G, 1536M; up to the
                                     template's size, which ZEROBOOT_MEMORY sets)
  %sandbox reset                     back to a clean sandbox, dropping every checkpoint
  %sandbox files [MODE]              what of the host is shown (the notebook's project), and how:
                                       overlay    reads from the host, writes stay in the sandbox
                                       readonly   writes fail (read-only file system)
                                       readwrite  writes go to the host folder (trusted notebooks)
  %sandbox diff                      what the sandbox created (A), changed (M), deleted (D) there
  %sandbox export PATH [DEST]        copy PATH as the sandbox sees it into the host folder
                                     (regular files and folders; symlinks are not followed)
  %sandbox outputs [POLICY]          show or set what rich outputs may do in the browser:
                                       trusted    as the cell made them (HTML, JavaScript)
                                       safe       no JavaScript; HTML and Markdown sanitised
  %sandbox network                   what the sandbox may connect to (ZEROBOOT_NETWORK in the
                                     kernelspec's env; read-only here) and the connections made
                                     and refused
  %sandbox save [NAME|PATH]          save the live session (variables, files of the overlay) to a
                                     file, NAME in the saves folder or a PATH with a '/'
  %sandbox resume NAME|PATH          replace the session by a save (checkpoints start again there)
  %sandbox saves                     list the saves with size, age and template
  %sandbox help                      this text

  %%fanout NAME in EXPR [--jobs N]   run the cell once per value of EXPR, each in a fork of the
                                     live state; results in _fanout, the state itself unchanged;
                                     --jobs N: in N worker engines (pays for cells of ~100 ms+)

A cell that crashes, runs past its time limit or ignores an interrupt is rolled back: it costs
that cell, never the session. Magics must come before any code in a cell.
"""

# A kernel magic line: `%rewind ...` or `%sandbox ...` at the start of a line (leading blanks
# allowed among the leading lines of a cell only).
_MAGIC_LINE = re.compile(r"^\s*%(rewind|sandbox)(?:\s+(.*))?\s*$")


class MagicUsageError(ValueError):
    """A kernel magic was written wrongly; the message says how to write it."""


@dataclass(frozen=True)
class Rewind:
    n: int = 1


@dataclass(frozen=True)
class SandboxCommand:
    sub: str                   # one of SUBCOMMANDS (SANDBOX_PARSERS)
    arg: str | None = None     # mode for `mode`/`files`, seconds (as text) for `timeout`, PATH for `export`
    dest: str | None = None    # DEST for `export`; SIZE for `checkpoints budget` (None: show it)

    @property
    def seconds(self) -> float:
        """The timeout argument as a number (validated at parse time)."""
        return float(self.arg or 0)


Magic = Union[Rewind, SandboxCommand]


@dataclass(frozen=True)
class CellPlan:
    magics: tuple[Magic, ...]
    code: str                  # what goes to the guest; "" when the cell is only magics

    @property
    def touches_guest(self) -> bool:
        return bool(self.code.strip())


def split_cell(code: str) -> CellPlan:
    """Split a cell into its leading kernel magics and the code for the guest.

    Blank and comment lines may sit between leading magics. A kernel magic after the first line
    of code is an error (it would otherwise reach the guest's IPython as an unknown magic).
    """
    lines = code.splitlines(keepends=True)
    magics: list[Magic] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        m = _MAGIC_LINE.match(lines[i])
        if not m:
            break
        magics.append(parse_magic(m.group(1), m.group(2) or ""))
        i += 1
    if not magics:
        rest = code
    else:
        rest = "".join(lines[i:])
    if _has_late_kernel_magic(rest):
        raise MagicUsageError("%rewind and %sandbox are run by the kernel and must come before any code "
                              "in the cell: move them to the top of the cell or into a cell of their own")
    return CellPlan(tuple(magics), rest if rest.strip() else "")


def _has_late_kernel_magic(code: str) -> bool:
    """True if IPython would turn some line of `code` into a call of %rewind or %sandbox."""
    if "%rewind" not in code and "%sandbox" not in code:
        return False  # the common case, without parsing
    try:
        transformed = _transformer().transform_cell(code)
    except Exception:  # noqa: BLE001 - invalid code: let the guest report the syntax error
        return False
    return re.search(r"run_line_magic\(\s*['\"](rewind|sandbox)['\"]", transformed) is not None


@lru_cache(maxsize=1)
def _transformer() -> Any:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager()


def parse_magic(name: str, rest: str) -> Magic:
    """Parse one magic line given its name ("rewind"/"sandbox") and the text after it."""
    rest = rest.split("#", 1)[0].strip()  # allow a trailing comment
    try:
        args = shlex.split(rest)
    except ValueError as exc:
        raise MagicUsageError(f"cannot parse %{name} {rest}: {exc}") from None
    if name == "rewind":
        return _parse_rewind(args)
    return _parse_sandbox(args)


def _parse_rewind(args: list[str]) -> Rewind:
    if not args:
        return Rewind(1)
    if len(args) == 1 and args[0].isdigit() and int(args[0]) >= 1:
        return Rewind(int(args[0]))
    raise MagicUsageError(f"usage: %rewind [N] with N a whole number >= 1 (got: {' '.join(args)})")


def _usage(params: list[str], usage: str) -> MagicUsageError:
    return MagicUsageError(f"usage: {usage} (got: {' '.join(params)})")


def _parse_no_args(sub: str, params: list[str]) -> SandboxCommand:
    if params:
        raise MagicUsageError(f"%sandbox {sub} takes no arguments (got: {' '.join(params)})")
    return SandboxCommand(sub)


def _parse_choice(sub: str, params: list[str], choices: tuple[str, ...]) -> SandboxCommand:
    """`%sandbox SUB [ONE_OF_CHOICES]`: show (no argument) or set."""
    if len(params) > 1 or (params and params[0] not in choices):
        raise _usage(params, f"%sandbox {sub} [{'|'.join(choices)}]")
    return SandboxCommand(sub, params[0] if params else None)


def _parse_timeout(sub: str, params: list[str]) -> SandboxCommand:
    if not params:
        return SandboxCommand(sub)
    try:
        seconds = float(params[0])
    except ValueError:
        seconds = -1.0
    if len(params) > 1 or seconds < 0 or not math.isfinite(seconds):
        raise _usage(params, "%sandbox timeout [SECONDS] with SECONDS >= 0, 0 for no limit")
    return SandboxCommand(sub, params[0])


def _parse_memory(sub: str, params: list[str]) -> SandboxCommand:
    if len(params) > 1:
        raise _usage(params, "%sandbox memory [SIZE] such as 2G or 1536M")
    if params:
        try:
            parse_size(params[0], "%sandbox memory")
        except MemorySizeError as exc:
            raise MagicUsageError(str(exc)) from None
    return SandboxCommand(sub, params[0] if params else None)


def _parse_checkpoints(sub: str, params: list[str]) -> SandboxCommand:
    if not params:
        return SandboxCommand(sub)
    if params[0] != "budget" or len(params) > 2:
        raise _usage(params, "%sandbox checkpoints [budget [SIZE|auto]]")
    if len(params) == 2:
        try:
            parse_budget(params[1])
        except BudgetSyntaxError as exc:
            raise MagicUsageError(f"usage: %sandbox checkpoints budget SIZE: {exc}") from None
    return SandboxCommand(sub, "budget", params[1] if len(params) == 2 else None)


def _parse_network(sub: str, params: list[str]) -> SandboxCommand:
    if params:
        raise MagicUsageError("%sandbox network only shows the policy: it is the kernel's setting, not the notebook's. "
                              "An operator changes it with ZEROBOOT_NETWORK in the kernelspec's env (kernel.json) "
                              "and a kernel restart")
    return SandboxCommand(sub)


def _parse_export(sub: str, params: list[str]) -> SandboxCommand:
    if not 1 <= len(params) <= 2:
        raise MagicUsageError("usage: %sandbox export PATH [DEST] (paths relative to the notebook's folder)")
    return SandboxCommand(sub, params[0], params[1] if len(params) == 2 else None)


def _parse_save(sub: str, params: list[str]) -> SandboxCommand:
    if sub == "save" and len(params) <= 1:
        return SandboxCommand(sub, params[0] if params else None)
    if sub == "resume" and len(params) == 1:
        return SandboxCommand(sub, params[0])
    raise MagicUsageError("usage: %sandbox save [NAME|PATH], %sandbox resume NAME|PATH")


# The %sandbox subcommands, in the order `%sandbox help` and the usage errors name them, each with
# the parser of its arguments. The kernel has one handler per entry (ZerobootKernel.SANDBOX_MAGICS,
# checked against this table by tests/test_wire_contracts.py).
SANDBOX_PARSERS: dict[str, Callable[[str, list[str]], SandboxCommand]] = {
    "mode": lambda sub, params: _parse_choice(sub, params, MODES),
    "checkpoints": _parse_checkpoints,
    "stats": _parse_no_args,
    "timeout": _parse_timeout,
    "memory": _parse_memory,
    "reset": _parse_no_args,
    "files": lambda sub, params: _parse_choice(sub, params, FILES_MODES),
    "diff": _parse_no_args,
    "export": _parse_export,
    "outputs": lambda sub, params: _parse_choice(sub, params, OUTPUT_POLICIES),
    "network": _parse_network,
    "save": _parse_save,
    "resume": _parse_save,
    "saves": _parse_no_args,
    "help": _parse_no_args,
}
SUBCOMMANDS = tuple(SANDBOX_PARSERS)


def _parse_sandbox(args: list[str]) -> SandboxCommand:
    if not args:
        return SandboxCommand("help")
    sub, params = args[0], args[1:]
    parser = SANDBOX_PARSERS.get(sub)
    if parser is None:
        raise MagicUsageError(f"unknown %sandbox subcommand {sub!r}: use one of {', '.join(SUBCOMMANDS)} "
                              f"(`%sandbox help` explains them)")
    return parser(sub, params)


# ---- what the magics print ----------------------------------------------------------------

def format_budget(info: dict[str, Any] | None) -> str:
    """The budget lines of %sandbox checkpoints (info: Session.describe_budget())."""
    if not info:
        return ""
    line = (f"memory: the checkpoints hold {mib(int(info.get('held_bytes', 0)))} of a budget of "
            f"{mib(int(info.get('budget_bytes', 0)))} ({info.get('budget_source', 'default')}; "
            f"`%sandbox checkpoints budget SIZE` changes it)\n")
    line += f"%rewind can go back {info.get('rewind_depth', 0)} cell(s): {info.get('why', '')}\n"
    if info.get("where"):
        line += f"where: {info['where']}\n"
    if info.get("spilled_for_budget"):
        line += (f"{info['spilled_for_budget']} checkpoint(s) spilled to disk for the budget in this session, oldest "
                 f"first (ZEROBOOT_CHECKPOINT_DISK sets the disk budget)\n")
    if info.get("spilled_while_idle"):
        line += (f"{info['spilled_while_idle']} checkpoint(s) spilled to disk while the notebook was idle (only the "
                 f"next cell's stays in memory then; ZEROBOOT_IDLE_RELEASE sets after how long)\n")
    if info.get("dropped_for_budget"):
        line += f"{info['dropped_for_budget']} checkpoint(s) dropped for the budget in this session, oldest first\n"
    return line


def format_checkpoints(rows: list[dict[str, Any]], mode: str, budget: dict[str, Any] | None = None) -> str:
    if mode == "isolated":
        head = "isolated mode: every cell starts from the template; %rewind needs chained mode.\n"
    else:
        head = ""
    head += format_budget(budget)
    if not rows:
        return head + "no checkpoints yet (one is taken before every cell run in chained mode)\n"
    lines = [head + f"{len(rows)} checkpoint(s), newest last; `%rewind N` returns to the N-th from the end:",
             f"  {'N':>3}  {'before':>7}  {'where':>6}  {'size':>11}  {'age':>8}  cell"]
    for back, row in zip(range(len(rows), 0, -1), rows):
        where = str(row.get("where", "memory"))
        size = row.get("disk_kib", 0) if where == "disk" else row.get("private_kib", 0)
        lines.append(f"  {back:>3}  [{row.get('before_cell', '?')}]".ljust(15)
                     + f"  {where:>6}  {size:>7} KiB  {row.get('age_s', 0):>7}s  {row.get('code', '')}")
    return "\n".join(lines) + "\n"


def format_diff(changes: list[list[str]], directory: str | None, more: int = 0) -> str:
    """The changes as lines; guest names are escaped (listing.printable), so a name holding a
    newline or a terminal escape shows as such instead of forging lines."""
    if not changes:
        return f"no changes to {directory or 'the notebook folder'} in the sandbox\n"
    labels = {"A": "created", "M": "changed", "D": "deleted", "!": "nested too deep: contents not listed"}
    lines = [f"changes in the sandbox to {directory} (the host folder is untouched; %sandbox export copies):"]
    lines += [f"  {tag} {printable(path)}   ({labels.get(tag, tag)})" for tag, path in changes]
    if more:
        lines.append(f"  ... and {more} more")
    return "\n".join(lines) + "\n"


def format_files(files: dict[str, Any]) -> str:
    """%sandbox files: what of the host the sandbox shows, and how."""
    root, notebook, mode = files.get("directory"), files.get("notebook"), files.get("mode")
    if not root:
        return "no host folder is shown in the sandbox\n"
    how = {"overlay": "reads from the host, writes stay private to the sandbox",
           "readonly": "read-only (writes fail with EROFS)",
           "readwrite": "writes go to the host"}.get(str(mode), str(mode))
    lines = [f"shown in the sandbox at its own path: {root} ({mode}: {how})"]
    if notebook and notebook != root:
        lines.append(f"the notebook's folder {notebook} is the working directory; the project root was chosen "
                     f"as the nearest folder above it with .git, pyproject.toml, setup.py, requirements.txt, ... "
                     f"(set ZEROBOOT_PROJECT_ROOT to choose, 'notebook' for the notebook's folder alone)")
    lines.append("everything else of the host is invisible except the Python environment (read-only); "
                 "change the mode with `%sandbox files overlay|readonly|readwrite`")
    return "\n".join(lines) + "\n"


def format_network_counters(net: dict[str, Any]) -> str:
    """The engine's network counters (native Engine.network_stats) for %sandbox network and stats."""
    return (f"this session: {net.get('connects', 0)} connection(s) allowed, {net.get('refused', 0)} refused; "
            f"{net.get('dns_queries', 0)} DNS queries ({net.get('dns_refused', 0)} for names not allowed); "
            f"{net.get('bytes_sent', 0)} bytes sent, {net.get('bytes_received', 0)} received\n")


def format_stats(stats: dict[str, Any], kernel: dict[str, Any]) -> str:
    tpl = stats.get("template") or {}

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.2f} ms"

    rows = [
        ("mode", stats.get("mode")),
        ("project folder shown", "{directory} ({mode})".format(**stats["files"]) if (stats.get("files") or {}).get("directory")
         else "not mounted"),
        ("cell timeout", kernel.get("timeout") or "none"),
        ("cells run in the sandbox", stats.get("cells_run")),
        ("rollbacks (crash/timeout/interrupt)", stats.get("rollbacks")),
        ("checkpoints kept", f"{stats.get('checkpoints')} ({stats.get('checkpoint_kib', 0) / 1024:.1f} MiB private)"),
        ("checkpoint memory / budget", "-" if not stats.get("checkpoint_budget") else
         f"{mib(stats['checkpoint_budget']['held_bytes'])} / {mib(stats['checkpoint_budget']['budget_bytes'])} "
         f"({stats['checkpoint_budget']['budget_source']})"),
        ("%rewind depth", "-" if not stats.get("checkpoint_budget") else
         f"{stats['checkpoint_budget']['rewind_depth']} cell(s): {stats['checkpoint_budget']['why']}"),
        ("checkpoints in memory / on disk", "-" if not stats.get("checkpoint_budget") else
         stats["checkpoint_budget"].get("where", "-")),
        ("checkpoint (fork point) p50", ms(stats.get("checkpoint_ms_p50"))),
        ("cell execution in the VM p50", ms(stats.get("execute_ms_p50"))),
        ("cell round trip in the kernel p50", ms(kernel.get("round_trip_ms_p50"))),
        ("memory of the live fork",
         f"{stats.get('guest_memory_mib')} MiB of {stats.get('guest_memory_limit_mib')} MiB"),
        ("unchanged pages given back while idle", f"{stats.get('released_mib', 0)} MiB"),
        ("guest syscalls / VM exits", f"{stats.get('syscalls')} / {stats.get('exits')}"),
        ("network (%sandbox network)", "none" if not stats.get("network") else
         format_network_counters(stats["network"]).strip().removeprefix("this session: ")),
        ("template", f"{tpl.get('name')} (preloaded: {', '.join(tpl.get('preload') or []) or 'nothing'}; "
                     f"built {tpl.get('built')})"),
        ("template directory", tpl.get("directory")),
        ("engine process", kernel.get("engine_pid")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows) + "\n"
