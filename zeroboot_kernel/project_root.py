"""Which host folder a notebook session shows in the sandbox: the notebook's project, not only its folder.

Notebooks commonly live in `notebooks/` beside `data/` and `src/` and read `../data/x.csv` or import
from `../src` (through a sys.path edit). The sandbox therefore shows the nearest enclosing folder
that looks like a project root (PROJECT_MARKERS: a version-control checkout or a Python project
file), at its own path. Bounds: the folder is strictly below the user's home (the home itself, with
its dot-files and credentials, is never shown because of a notebook deeper down), never `/` or a
folder directly under it (/home, /srv, /work: shared by many projects), and if no marker is found
the notebook's folder alone is shown, as before.

    ZEROBOOT_PROJECT_ROOT  a folder that contains the notebook's folder: show it instead of
                           searching; "notebook" shows the notebook's folder alone
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from .errors import ZerobootError

log = logging.getLogger(__name__)

PROJECT_MARKERS = (".git", ".hg", ".svn", "pyproject.toml", "setup.py", "setup.cfg", "requirements.txt",
                   "environment.yml", "environment.yaml", "Pipfile", "DESCRIPTION", ".zeroboot-project")
MAX_LEVELS = 16  # how far up the search goes


class ProjectRootError(ZerobootError):
    """ZEROBOOT_PROJECT_ROOT names a folder the kernel cannot show."""


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _allowed(candidate: str, home: str | None) -> bool:
    """Not /, not a folder directly under /, not the home nor anything above it."""
    if os.path.dirname(candidate) in ("/", candidate):
        return False
    if home and home != "/" and _inside(home, candidate):  # candidate is home or an ancestor of it
        return False
    return True


def _home(env: Mapping[str, str]) -> str | None:
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.realpath(home) if home and home != "~" else None


def find_project_root(notebook_dir: str, env: Mapping[str, str] | None = None) -> str:
    """The folder to show for a notebook in `notebook_dir` (an absolute, real path is returned)."""
    env = os.environ if env is None else env
    notebook_dir = os.path.realpath(notebook_dir)
    home = _home(env)
    setting = (env.get("ZEROBOOT_PROJECT_ROOT") or "").strip()
    if setting:
        if setting.lower() == "notebook":
            return notebook_dir
        root = os.path.realpath(os.path.expanduser(setting))
        if not os.path.isdir(root):
            raise ProjectRootError(f"ZEROBOOT_PROJECT_ROOT={setting!r} is not a folder")
        if not _inside(notebook_dir, root):
            raise ProjectRootError(f"ZEROBOOT_PROJECT_ROOT={setting!r} does not contain the notebook's folder "
                                   f"{notebook_dir}: give a folder above it, or 'notebook'")
        if root != notebook_dir and not _allowed(root, home):
            raise ProjectRootError(f"ZEROBOOT_PROJECT_ROOT={setting!r}: the sandbox never shows the home folder, "
                                   f"a folder above it, / or a folder directly under /; give a project folder")
        return root
    candidate = notebook_dir
    for _ in range(MAX_LEVELS):
        if not _allowed(candidate, home):
            break
        if any(os.path.lexists(os.path.join(candidate, marker)) for marker in PROJECT_MARKERS):
            if candidate != notebook_dir:
                log.info("the notebook's project root is %s (shown in the sandbox)", candidate)
            return candidate
        parent = os.path.dirname(candidate)
        if parent == candidate:
            break
        candidate = parent
    return notebook_dir
