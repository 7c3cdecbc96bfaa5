"""Which environment variables of the kernel a notebook's sandbox sees (docs/COMPATIBILITY.md).

ipykernel runs cells in the kernel process, so a cell sees the kernel's whole environment: the
kernelspec's `env`, what JupyterHub or `export X=...; jupyter lab` set (API keys, data paths,
settings). The sandbox forwards the same by default, minus the variables listed in WITHHELD, which
describe the host rather than the notebook (its identity, its programs and libraries, sockets of
its desktop session, the kernel's own settings) and would mislead or break code in the guest.

    ZEROBOOT_ENV        inherit (default): forward the kernel's environment, minus WITHHELD
                        clean: forward nothing but the locale and time zone (LANG, LC_*, TZ)
    ZEROBOOT_ENV_ALLOW  comma-separated names or shell patterns (AWS_*) forwarded even when clean,
                        or when withheld by default (an explicit allow wins)
    ZEROBOOT_ENV_DENY   comma-separated names or patterns never forwarded (wins over everything)

Variables that numeric libraries read once, when they are imported (TEMPLATE_VARIABLES, e.g.
OPENBLAS_CORETYPE, which picks OpenBLAS's kernels and so the last digits of results), cannot be
changed after the template imported numpy: they are set in the template's own environment and are
part of its key, so a kernel started with another value gets (builds) another template.
"""
from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping

from .errors import ZerobootError
from .guest_view import program_in_system_view

ENV_MODES = ("inherit", "clean")

# name or pattern -> why the guest does not get the host's value
WITHHELD: dict[str, str] = {
    "PATH": "the guest's programs are the sandbox's view; its PATH is set by the sandbox",
    "HOME": "the guest has its own home directory (/home/sandbox)",
    "USER": "the guest's identity is fixed (user 'sandbox')",
    "LOGNAME": "the guest's identity is fixed (user 'sandbox')",
    "USERNAME": "the guest's identity is fixed (user 'sandbox')",
    "MAIL": "a host path of the user's mailbox",
    "TMPDIR": "the guest has its own private /tmp",
    "PWD": "the guest's working directory is set by the sandbox",
    "OLDPWD": "the guest's working directory is set by the sandbox",
    "LD_*": "the dynamic loader's settings name host libraries; the guest's interpreter is already loaded",
    "PYTHONHOME": "the guest's interpreter is already started",
    "PYTHONSTARTUP": "the guest's interpreter is already started",
    "PYTHONDONTWRITEBYTECODE": "set by the sandbox (the view is read-only)",
    "VIRTUAL_ENV": "the guest's interpreter is already the environment's own",
    "CONDA_PREFIX*": "the guest's interpreter is already the environment's own",
    "MPLBACKEND": "matplotlib is imported by the template with the inline backend (as ipykernel sets it)",
    "OPENBLAS_NUM_THREADS": "the sandbox runs one thread: numeric libraries must not start more",
    "OMP_NUM_THREADS": "the sandbox runs one thread: numeric libraries must not start more",
    "MKL_NUM_THREADS": "the sandbox runs one thread: numeric libraries must not start more",
    "NUMEXPR_NUM_THREADS": "the sandbox runs one thread: numeric libraries must not start more",
    "VECLIB_MAXIMUM_THREADS": "the sandbox runs one thread: numeric libraries must not start more",
    "ZEROBOOT_*": "the kernel's own settings",
    "JPY_PARENT_PID": "a host process id, meaningless in the guest",
    "DISPLAY": "a socket of the host's desktop session",
    "WAYLAND_DISPLAY": "a socket of the host's desktop session",
    "XAUTHORITY": "a host credential file of the desktop session",
    "XDG_RUNTIME_DIR": "a host directory of the desktop session",
    "XDG_SESSION_*": "the host's desktop session",
    "DBUS_SESSION_BUS_ADDRESS": "a socket of the host's desktop session",
    "SSH_AUTH_SOCK": "a socket of the host's ssh agent",
    "SSH_AGENT_PID": "a host process id",
    "SSH_CONNECTION": "the host's network connection",
    "SSH_CLIENT": "the host's network connection",
    "SSH_TTY": "a host terminal",
    "GPG_AGENT_INFO": "a socket of the host's gpg agent",
    "TERM": "set by the shell as ipykernel sets it (xterm-color)",
    "SHLVL": "a property of the host shell",
    "_": "a property of the host shell",
}

# Always forwarded, also when clean: they say how the user reads text and time, not what they do.
LOCALE_VARIABLES = ("LANG", "LANGUAGE", "LC_*", "TZ")

# Read once when numeric libraries load (in the template): part of the template's environment and
# key. Thread counts are not here: the sandbox forces one thread.
TEMPLATE_VARIABLES = (
    "OPENBLAS_CORETYPE", "OPENBLAS_VERBOSE", "OPENBLAS_L2_SIZE",
    "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
    "NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES",
    "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONUTF8",
)

MAX_VARIABLES = 4096
MAX_VALUE = 128 * 1024


class EnvironmentConfigError(ZerobootError):
    """ZEROBOOT_ENV* has a value the kernel cannot use."""


def _patterns(raw: str | None) -> list[str]:
    return [p.strip() for p in (raw or "").split(",") if p.strip()]


def _matches(name: str, patterns: list[str] | tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def withheld_reason(name: str) -> str | None:
    """Why `name` is withheld by default, or None if it is forwarded."""
    for pattern, reason in WITHHELD.items():
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


def env_mode(env: Mapping[str, str]) -> str:
    mode = (env.get("ZEROBOOT_ENV") or "inherit").strip().lower()
    if mode not in ENV_MODES:
        raise EnvironmentConfigError(f"ZEROBOOT_ENV={env.get('ZEROBOOT_ENV')!r}: use inherit (forward the kernel's "
                                     f"environment) or clean (only LANG, LC_* and TZ; add names with "
                                     f"ZEROBOOT_ENV_ALLOW)")
    return mode


def session_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `env` (default: this process's environment) a new sandbox gets."""
    env = os.environ if env is None else env
    mode = env_mode(env)
    allow = _patterns(env.get("ZEROBOOT_ENV_ALLOW"))
    deny = _patterns(env.get("ZEROBOOT_ENV_DENY"))
    out: dict[str, str] = {}
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value or len(value) > MAX_VALUE:
            continue
        if _matches(name, deny):
            continue
        if _matches(name, allow) or _matches(name, LOCALE_VARIABLES):
            out[name] = value
        elif name == "SHELL":
            # IPython's `!cmd` and `%%sx` run `$SHELL -c cmd` (sh without it): the user's shell,
            # when the sandbox has that program, so that `!echo {1..3}` means what it means under
            # ipykernel (bash: 1 2 3; sh: {1..3})
            if mode == "inherit" and program_in_system_view(value, dict(env)):
                out[name] = value
        elif mode == "inherit" and withheld_reason(name) is None and not _matches(name, TEMPLATE_VARIABLES):
            out[name] = value
        if len(out) >= MAX_VARIABLES:
            break
    return out


def template_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The load-time variables of the host to set in a template's environment (and key)."""
    env = os.environ if env is None else env
    return {name: env[name] for name in sorted(env) if _matches(name, TEMPLATE_VARIABLES)}
