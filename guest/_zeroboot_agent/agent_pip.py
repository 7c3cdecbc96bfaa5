"""`%pip` in the sandbox: IPython's magic (`sys.executable -m pip ARGS` through the shell's `system`,
here a guest process), with what the sandbox needs around it.

- `%pip install` installs into the sandbox's own site-packages, SANDBOX_SITE (the user site's
  layout under the sandbox's in-memory home): the environment's site-packages are read-only in the
  view, and in a venv pip would not use a user site at all. The magic adds `--target SANDBOX_SITE`
  unless the command names a location itself (--target, --prefix, --root, --user). SANDBOX_SITE
  is on sys.path ahead of the environment's site-packages from the agent's start (and on
  PYTHONPATH for the sandbox's other Python processes), so a package installed in one cell imports
  in the next, and an upgrade shadows the template's copy. Like every file of the sandbox, the
  installed files belong to its state: a rewind to before the install removes them again.
- Without network (the kernel's ZEROBOOT_NETWORK allows nothing, so a UDP `socket()` is refused), a
  command that needs a package index says so at once, with the three ways out (local files, the
  operator's allow list, the template's environment), instead of pip's retries and "No matching
  distribution". Local wheels, `--no-index --find-links DIR` and `-f DIR` run as usual.
"""
from __future__ import annotations

import _socket
import importlib
import os
import shlex
import site
import sys
from builtins import any, enumerate, frozenset, isinstance, len, list, next, print, str, tuple  # noqa: A004 - agent_shell
from typing import Any

SANDBOX_SITE = os.path.join("/home/sandbox", ".local", "lib",
                            f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")

# pip options that take the next argument as their value (so that it is not read as a requirement)
_VALUE_OPTIONS = frozenset((
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-f", "--find-links", "-i", "--index-url",
    "--extra-index-url", "-t", "--target", "--prefix", "--root", "--platform", "--python-version",
    "--implementation", "--abi", "--src", "--upgrade-strategy", "--progress-bar", "--log", "--cache-dir",
    "--trusted-host", "--proxy", "--timeout", "--retries", "--exists-action", "--cert", "--client-cert",
    "--report", "-d", "--dest", "-w", "--wheel-dir", "-C", "--config-settings", "--global-option",
    "--only-binary", "--no-binary", "--use-feature", "--use-deprecated", "--python", "--keyring-provider",
    "--root-user-action", "--group", "--build-constraint",
))
_LOCATION_OPTIONS = ("-t", "--target", "--prefix", "--root", "--user")
_INDEX_COMMANDS = ("install", "download", "wheel")

NO_NETWORK = (
    "zeroboot: `%pip {command}` needs a package index for {names}, and this sandbox has no network: the kernel's "
    "ZEROBOOT_NETWORK setting allows no destination (the default). Ways out:\n"
    "  - install from files in the notebook's folder: `%pip install ./pkg-1.0-py3-none-any.whl`, or "
    "`%pip install --no-index --find-links ./wheels pkg`;\n"
    "  - ask the operator to allow the index in the kernelspec's env, e.g. "
    "ZEROBOOT_NETWORK=pypi.org,files.pythonhosted.org (`%sandbox network` shows the list);\n"
    "  - add the package to the template: install it into the kernel's Python environment on the host "
    "(`{python} -m pip install PKG`); the template is rebuilt from that environment when the kernel next starts."
)
FAILED_NO_NETWORK = ("zeroboot: pip failed, and this sandbox has no network (ZEROBOOT_NETWORK allows none): "
                     "if it needed the package index, install from local files (--no-index --find-links DIR) or "
                     "ask the operator to allow the index; `%sandbox network` shows the list.")


def enable_site() -> None:
    """SANDBOX_SITE on sys.path ahead of the environment's site-packages (once, at the agent's
    start: a directory that does not exist yet costs nothing until it does), and first on
    PYTHONPATH for the sandbox's other Python processes."""
    if SANDBOX_SITE not in sys.path:
        at = next((i for i, p in enumerate(sys.path) if p.endswith("-packages")), len(sys.path))
        sys.path.insert(at, SANDBOX_SITE)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SANDBOX_SITE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, SANDBOX_SITE])


def network_allowed() -> bool:
    """Whether the sandbox has a network: with no policy the engine refuses a UDP socket with
    EACCES (a refusal that leaves no trace and needs no connection; TCP sockets exist either way,
    on the sandbox's own loopback without a policy), with one UDP reaches the sandbox's resolver."""
    try:
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    except PermissionError:
        return False
    except OSError:
        return True  # some other failure: let pip report what it finds
    s.close()
    return True


def _split(args: list[str]) -> tuple[str, list[str], list[str]]:
    """(the pip command, its positional arguments, its options) of a pip argument list."""
    command, positional, options = "", [], []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a.startswith("-"):
            options.append(a.split("=", 1)[0])
            skip = "=" not in a and a in _VALUE_OPTIONS
        elif not command:
            command = a
        else:
            positional.append(a)
    return command, positional, options


def _local(req: str) -> bool:
    return req.startswith(("file:", "./", "../", "/", "~")) or os.path.exists(os.path.expanduser(req))


def pip_args(args: list[str], network: bool) -> tuple[list[str], str | None]:
    """The arguments to run pip with, or (args, the refusal to print instead of running it)."""
    command, positional, options = _split(args)
    if command in _INDEX_COMMANDS and not network and "--no-index" not in options and \
            not any(o in ("-f", "--find-links") for o in options):
        remote = [r for r in positional if not _local(r)]
        if remote or (not positional and not any(o in ("-r", "--requirement", "-e", "--editable") for o in options)):
            names = ", ".join(remote) if remote else "its requirements"
            return args, NO_NETWORK.format(command=command, names=names, python=shlex.quote(sys.executable))
    out = list(args)
    if command and "--disable-pip-version-check" not in options:  # it would ask pypi.org, allowed or not
        out[out.index(command) + 1:out.index(command) + 1] = ["--disable-pip-version-check"]
    if command in _INDEX_COMMANDS and not network:
        out[out.index(command) + 1:out.index(command) + 1] = ["--retries", "0"]  # no 5 retries of a refused socket
    if command == "install" and not any(o in _LOCATION_OPTIONS for o in options):
        out[out.index(command) + 1:out.index(command) + 1] = ["--target", SANDBOX_SITE]
    return out, None


def pip_magic(shell: Any, line: str) -> None:
    """%pip ARGS: IPython's magic (pip in a process of the sandbox, its output streamed to the
    cell) with the sandbox's install location and its no-network answer."""
    try:
        args = shlex.split(line)
    except ValueError as exc:
        from IPython.core.error import UsageError
        raise UsageError(f"%pip: {exc}") from None
    network = network_allowed()
    run, refusal = pip_args(args, network)
    if refusal:
        print(refusal, file=sys.stderr)
        shell.user_ns["_exit_code"] = 1
        return
    shell.system(" ".join([shlex.quote(sys.executable), "-m", "pip", *(shlex.quote(a) for a in run)]))
    code = shell.user_ns.get("_exit_code", 0)
    importlib.invalidate_caches()  # the new directories and modules, for the next import
    if os.path.isdir(SANDBOX_SITE):
        site.addsitedir(SANDBOX_SITE)  # its .pth files (it is on sys.path already)
    if code and not network and isinstance(code, int):
        print(FAILED_NO_NETWORK, file=sys.stderr)
    elif not code and _split(run)[0] == "install":
        print(f"Note: installed into the sandbox's site-packages ({SANDBOX_SITE}); it imports from the next cell "
              "on. A module imported before this install keeps its old version until the kernel restarts.")
