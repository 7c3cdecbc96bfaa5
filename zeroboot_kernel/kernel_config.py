"""The kernel's settings, from the environment variables its kernelspec sets.

    ZEROBOOT_MODE          chained (default) or isolated
    ZEROBOOT_TEMPLATE      template name (default "default"); built on first use
    ZEROBOOT_CELL_TIMEOUT  seconds a cell may run, 0 or empty for no limit
    ZEROBOOT_CHECKPOINTS   how many checkpoints %rewind can go back to (default 20)
    ZEROBOOT_FILES         how the notebook's folder is seen: overlay (default), readonly, readwrite
    ZEROBOOT_CHECKPOINT_MEMORY  memory the checkpoints may hold (e.g. 2G; default: see checkpoint_budget.py)
    ZEROBOOT_CHECKPOINT_DISK    disk the checkpoints spilled over that budget may use (e.g. 8G; 0: drop
                                them instead; default: see checkpoint_spill.py)
    ZEROBOOT_CHECKPOINT_SPILL_BEHIND  bounded (default), wait or drop: a checkpoint to spill while the
                                disk writer is still busy waits for it up to 2 s, as long as it takes,
                                or not at all, and is otherwise dropped (a gap for %rewind)
    ZEROBOOT_HIDE          paths in the notebook's folder the sandbox does not see, ':'-separated,
                           relative to the folder; "none" hides nothing; default: DEFAULT_HIDDEN
    ZEROBOOT_OUTPUTS       trusted (default) or safe: what rich outputs may do in the browser
                           (outputs.py; the isolated kernelspec sets safe)
    ZEROBOOT_NETWORK       none (default) or the network egress allow list (network_policy.py),
    ZEROBOOT_NETWORK_HOSTS with its optional static name=address answers, and its limits
    ZEROBOOT_NETWORK_MAX_CONNECTIONS, ZEROBOOT_NETWORK_RATE, ZEROBOOT_NETWORK_RESOLVER

Read by the engine process where they are used (docs/COMPATIBILITY.md):
    ZEROBOOT_ENV, ZEROBOOT_ENV_ALLOW, ZEROBOOT_ENV_DENY   the kernel's environment in the sandbox (guest_environ.py)
    ZEROBOOT_PROJECT_ROOT  the folder shown in the sandbox (project_root.py)
    ZEROBOOT_MEMORY        the sandbox's memory size (guest_memory_size.py)
    ZEROBOOT_SYSTEM_VIEW   host directories the sandbox sees read-only for execve (guest_view.py)
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from . import checkpoint_budget, checkpoint_spill, network_policy
from .errors import ZerobootError
from .network_policy import NetworkPolicy

MODES = ("chained", "isolated")
FILES_MODES = ("overlay", "readonly", "readwrite")
OUTPUT_POLICIES = ("trusted", "safe")
# Credentials and histories that sit in a home directory: when the notebook's folder is a home
# (Jupyter started from ~), untrusted cell code should not read them (docs/SECURITY.md).
DEFAULT_HIDDEN = (
    ".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".kube", ".docker", ".netrc",
    ".git-credentials", ".config/git/credentials", ".config/gh", ".pypirc", ".npmrc", ".pgpass", ".my.cnf",
    ".password-store", ".vault-token", ".terraform.d", ".jupyter", ".local/share/jupyter/runtime",
    ".bash_history", ".zsh_history", ".python_history", ".psql_history", ".mysql_history",
    ".sqlite_history", ".node_repl_history", ".lesshst", ".local/share/fish/fish_history",
)
_TEMPLATE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # a directory name in the template cache


class KernelConfigError(ZerobootError):
    """An environment variable of the kernelspec has a value the kernel cannot use."""


@dataclass(frozen=True)
class KernelSettings:
    mode: str = "chained"
    template: str = "default"
    cell_timeout: float | None = None
    checkpoints: int = 20
    files: str = "overlay"
    outputs: str = "trusted"
    hidden: tuple[str, ...] = DEFAULT_HIDDEN
    network: NetworkPolicy = NetworkPolicy()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KernelSettings:
        env = os.environ if env is None else env
        mode = (env.get("ZEROBOOT_MODE") or "chained").strip().lower()
        if mode not in MODES:
            raise KernelConfigError(f"ZEROBOOT_MODE={env.get('ZEROBOOT_MODE')!r}: use chained or isolated "
                                    f"(set it in the kernelspec's kernel.json \"env\")")
        template = (env.get("ZEROBOOT_TEMPLATE") or "default").strip()
        if not _TEMPLATE_NAME.match(template):
            raise KernelConfigError(f"ZEROBOOT_TEMPLATE={template!r}: a template name is letters, digits, '_', "
                                    f"'-' and '.' (see `zeroboot-kernel template list`)")
        raw_timeout = (env.get("ZEROBOOT_CELL_TIMEOUT") or "0").strip()
        try:
            timeout = float(raw_timeout)
        except ValueError:
            timeout = -1.0
        if timeout < 0 or not math.isfinite(timeout):
            raise KernelConfigError(f"ZEROBOOT_CELL_TIMEOUT={raw_timeout!r}: give seconds >= 0 (0 = no limit)")
        raw_keep = (env.get("ZEROBOOT_CHECKPOINTS") or "20").strip()
        if not raw_keep.isdigit():
            raise KernelConfigError(f"ZEROBOOT_CHECKPOINTS={raw_keep!r}: give a whole number >= 0 "
                                    f"(how many cells %rewind can undo)")
        try:
            checkpoint_budget.from_env(env)  # read by the engine process (it inherits the env)
            checkpoint_spill.from_env(env)
            checkpoint_spill.wait_from_env(env)
        except checkpoint_budget.BudgetSyntaxError as exc:
            raise KernelConfigError(str(exc)) from None
        files = (env.get("ZEROBOOT_FILES") or "overlay").strip().lower()
        if files not in FILES_MODES:
            raise KernelConfigError(f"ZEROBOOT_FILES={env.get('ZEROBOOT_FILES')!r}: use overlay, readonly or readwrite")
        outputs = (env.get("ZEROBOOT_OUTPUTS") or "trusted").strip().lower()
        if outputs not in OUTPUT_POLICIES:
            raise KernelConfigError(f"ZEROBOOT_OUTPUTS={env.get('ZEROBOOT_OUTPUTS')!r}: use trusted or safe")
        raw_hide = env.get("ZEROBOOT_HIDE")
        hidden: tuple[str, ...]
        if raw_hide is None:
            hidden = DEFAULT_HIDDEN
        elif raw_hide.strip().lower() == "none":
            hidden = ()
        else:
            hidden = tuple(p.strip().strip("/") for p in raw_hide.split(":") if p.strip().strip("/"))
            bad = [p for p in hidden if ".." in p.split("/") or "\n" in p or "\0" in p]
            if bad:
                raise KernelConfigError(f"ZEROBOOT_HIDE: {bad[0]!r} is not a path inside the notebook's folder "
                                        f"(give ':'-separated relative paths, or none)")
        try:
            network = network_policy.from_env(env)
        except network_policy.NetworkPolicyError as exc:
            raise KernelConfigError(f"{exc} (set it in the kernelspec's kernel.json \"env\"; README, \"Network "
                                    f"access\")") from None
        return cls(mode=mode, template=template, cell_timeout=timeout or None, checkpoints=int(raw_keep), files=files,
                   outputs=outputs, hidden=hidden, network=network)
