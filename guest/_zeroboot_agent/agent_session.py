"""The start of a notebook session in the guest (the SESSION request, docs/PROTOCOL.md): the kernel's
environment variables and sys.path as ipykernel gives them to a notebook.

The template was built before any notebook existed, in the sandbox's home directory with a fixed
environment; a session starts from a fork of it. Under ipykernel the kernel process is started in the
notebook's folder with the user's environment, so a cell sees:
  - os.environ: the kernel's environment (the host forwards it, minus what describes the host),
    with TERM/CLICOLOR/PAGER as ipykernel's shell sets them;
  - the locale: Python's start-up sets LC_CTYPE from LANG/LC_*; time zone from TZ;
  - sys.path: [<PYTHONPATH entries>, <stdlib>, '', <site-packages>] ('' where IPython's
    InteractiveShellApp.init_path puts it; ipykernel_launcher removes the folder `python -m` adds);
  - sys.argv: [<site-packages>/ipykernel_launcher.py, -f, <connection file>] (argparse's
    parse_known_args in a notebook sees what it sees under ipykernel);
  - IPython's directory history (_dh, %dhist, `%cd -0`) starts at the notebook's folder.
"""
from __future__ import annotations

import locale
import os
import sys
import time
from pathlib import Path
from typing import Any
# User code may replace builtins; the agent's own code must not follow.
from builtins import dict, int, isinstance, len, list, str  # noqa: A004

MAX_VARIABLES = 4096
MAX_NAME = 1024
MAX_VALUE = 128 * 1024
MAX_ARGS = 64
MAX_ARG = 4096


def _valid(name: object, value: object) -> bool:
    return (isinstance(name, str) and isinstance(value, str) and 0 < len(name) <= MAX_NAME
            and len(value) <= MAX_VALUE and "=" not in name and "\0" not in name and "\0" not in value)


def apply_environment(environ: dict[str, Any], shell: Any) -> int:
    """Set the forwarded variables; returns how many were set."""
    count = 0
    for name, value in list(environ.items())[:MAX_VARIABLES]:
        if _valid(name, value):
            os.environ[name] = value
            count += 1
    init = getattr(shell, "init_environment", None)
    if init is not None:
        init()  # ipykernel's own values win over the host's (TERM=xterm-color, PAGER=cat, ...)
    if "TZ" in environ:
        time.tzset()
    return count


def apply_locale() -> str | None:
    """LC_CTYPE from the (new) locale variables, as Python's start-up does; None if the locale
    they name is not available in the sandbox (then the current one stays)."""
    try:
        return locale.setlocale(locale.LC_CTYPE, "")
    except locale.Error:
        return None


def insert_cwd_entry() -> None:
    """'' (the working directory) before the first site-packages, as IPython's init_path does."""
    if "" in sys.path:
        return
    for index, path in enumerate(sys.path):
        if os.path.basename(path) in ("site-packages", "dist-packages"):
            break
    else:
        index = 0
    sys.path.insert(index, "")


def apply_sys_path() -> None:
    """PYTHONPATH entries first, as the interpreter puts them when it starts."""
    insert_cwd_entry()
    position = 0
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if not entry:
            continue
        entry = os.path.abspath(entry)
        if entry in sys.path:
            continue
        sys.path.insert(position, entry)
        position += 1


def launcher_path() -> str:
    """Where ipykernel's launcher script is in this Python (argv[0] under ipykernel)."""
    try:
        import ipykernel
        return os.path.join(os.path.dirname(os.path.dirname(ipykernel.__file__)), "ipykernel_launcher.py")
    except ImportError:
        return "ipykernel_launcher.py"


def apply_argv(arguments: object) -> None:
    """sys.argv as `python -m ipykernel_launcher <arguments>` has it; the arguments are the kernel
    process's own (the kernelspec's `-f {connection_file}`), bounded, or none."""
    tail = []
    if isinstance(arguments, list):
        tail = [a for a in arguments[:MAX_ARGS] if isinstance(a, str) and len(a) <= MAX_ARG and "\0" not in a]
    sys.argv = [launcher_path(), *tail]


def restart_directory_history(shell: Any) -> None:
    """The shell was made in the template's home folder; a session starts in the notebook's."""
    history = getattr(shell, "history_manager", None)
    visited = getattr(history, "dir_hist", None)
    if isinstance(visited, list):
        visited[:] = [Path.cwd()]


def start_session(request: dict[str, Any], shell: Any) -> dict[str, Any]:
    environ = request.get("environ")
    count = apply_environment(environ, shell) if isinstance(environ, dict) else 0
    current = apply_locale()
    apply_sys_path()
    apply_argv(request.get("argv"))
    restart_directory_history(shell)
    return {"id": request.get("id"), "status": "ok", "variables": count, "locale": current}
