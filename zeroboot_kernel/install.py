"""Install and remove the kernelspecs (`zeroboot-kernel install|uninstall`).

The kernelspecs live in the repository's kernelspec/ folder (kernel.json + logos), which is
installed as the package zeroboot_kernel.kernelspec (so a wheel carries them). Installing copies
each one, with argv[0] set to the Python that runs this (the one the package is installed
in, so the kernel finds zeroboot_kernel), through jupyter_client's KernelSpecManager.
"""
from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import ZerobootError

log = logging.getLogger(__name__)

KERNEL_NAMES = ("zeroboot", "zeroboot-isolated")
SPEC_FILES = ("kernel.json", "logo-32x32.png", "logo-64x64.png")


class InstallError(ZerobootError):
    """The kernelspecs could not be installed or removed."""


@dataclass(frozen=True)
class Destination:
    """Where kernelspecs go: like `jupyter kernelspec install`, system-wide unless told otherwise."""

    user: bool = False
    prefix: str | None = None

    @classmethod
    def choose(cls, user: bool = False, sys_prefix: bool = False, prefix: str | None = None) -> Destination:
        if sum((bool(user), bool(sys_prefix), prefix is not None)) > 1:
            raise InstallError("give at most one of --user, --sys-prefix and --prefix")
        return cls(user=user, prefix=sys.prefix if sys_prefix else prefix)

    def kernels_dir(self) -> Path:
        from jupyter_core.paths import SYSTEM_JUPYTER_PATH, jupyter_data_dir

        if self.user:
            return Path(jupyter_data_dir()) / "kernels"
        if self.prefix is not None:
            return Path(self.prefix) / "share" / "jupyter" / "kernels"
        return Path(SYSTEM_JUPYTER_PATH[0]) / "kernels"


def kernelspec_source() -> Path:
    """The kernelspec/ folder: installed inside the package (zeroboot_kernel/kernelspec), or next
    to it in a source checkout."""
    here = Path(__file__).resolve().parent
    candidates = (here / "kernelspec", here.parent / "kernelspec")
    for candidate in candidates:
        if all((candidate / name / "kernel.json").is_file() for name in KERNEL_NAMES):
            return candidate
    raise InstallError(f"cannot find the kernelspecs {', '.join(KERNEL_NAMES)} in {' or '.join(map(str, candidates))}: "
                       f"this installation of zeroboot-kernel is incomplete; reinstall it")


def prepared_spec(name: str, target_dir: Path, python: str = sys.executable) -> Path:
    """Copy kernelspec/<name> into target_dir/<name> with argv[0] = `python`."""
    src = kernelspec_source() / name
    dst = target_dir / name
    dst.mkdir(parents=True)
    for fname in SPEC_FILES:
        if (src / fname).is_file():
            shutil.copy2(src / fname, dst / fname)
    spec = json.loads((src / "kernel.json").read_text())
    argv = list(spec.get("argv") or [])
    if not argv or "{connection_file}" not in argv:
        raise InstallError(f"{src / 'kernel.json'}: argv must run the kernel with {{connection_file}}")
    argv[0] = python
    spec["argv"] = argv
    (dst / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
    return dst


def install_kernelspecs(dest: Destination, python: str = sys.executable) -> list[str]:
    """Install both kernelspecs; returns the directories written."""
    from jupyter_client.kernelspec import KernelSpecManager

    ksm = KernelSpecManager()
    installed = []
    with tempfile.TemporaryDirectory(prefix="zeroboot-kernelspec-") as tmp:
        for name in KERNEL_NAMES:
            src = prepared_spec(name, Path(tmp), python)
            try:
                installed.append(ksm.install_kernel_spec(str(src), name, user=dest.user, prefix=dest.prefix))
            except PermissionError as exc:
                raise InstallError(f"no permission to write {exc.filename or dest.kernels_dir()}: use --user "
                                   f"(your Jupyter data dir), --sys-prefix (this environment) or --prefix P") from None
    return installed


def uninstall_kernelspecs(dest: Destination | None = None) -> list[str]:
    """Remove both kernelspecs from `dest`, or from everywhere Jupyter finds them when None."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    removed: list[str] = []
    if dest is not None:
        for name in KERNEL_NAMES:
            path = dest.kernels_dir() / name
            if path.is_dir():
                shutil.rmtree(path)
                removed.append(str(path))
        return removed
    for name in KERNEL_NAMES:
        while True:  # the same name may be installed for the user and system-wide
            try:
                removed.append(KernelSpecManager().remove_kernel_spec(name))
            except NoSuchKernel:
                break
            except PermissionError as exc:
                raise InstallError(f"no permission to remove {exc.filename}: run as its owner") from None
    return removed


def build_default_template(name: str = "default", progress: Callable[[str], None] | None = None) -> str:
    """Load or build the template the kernels start from; returns its directory."""
    from .template import Template, TemplateConfig, default_preload

    template = Template.ensure(TemplateConfig(name, default_preload()), progress=progress)
    try:
        return str(template.directory)
    finally:
        template.snapshot.release()
