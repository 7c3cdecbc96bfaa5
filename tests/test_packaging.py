"""The package metadata has one source for each fact: the version is zeroboot_kernel.__version__
(pyproject reads it), the licence is the SPDX expression plus the LICENSE file, and the ipykernel
floor is the first release with the API kernel.py uses. Building and installing the wheel is
tests/test_python_matrix.py's job (it runs a notebook with exactly that floor)."""
from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import zeroboot_kernel
from zeroboot_kernel.install import KERNEL_NAMES, kernelspec_source

pytestmark = pytest.mark.without_kvm

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "zeroboot_kernel.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", zeroboot_kernel.__version__)
    # the installed distribution (editable here) was built from that same attribute
    assert importlib.metadata.version("zeroboot-kernel") == zeroboot_kernel.__version__


def test_the_licence_is_an_spdx_expression_with_its_text() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"]  # the first to read PEP 639 fields


def test_the_ipykernel_floor_has_what_the_kernel_calls() -> None:
    deps = [d.replace(" ", "") for d in PYPROJECT["project"]["dependencies"]]
    (floor,) = [d.removeprefix("ipykernel>=") for d in deps if d.startswith("ipykernel")]
    assert floor == "7.1.0"  # 7.0.x has _shell_parent_ident but no _get_shell_context_var
    from ipykernel.kernelbase import Kernel

    assert callable(getattr(Kernel, "_get_shell_context_var", None))
    source = (ROOT / "zeroboot_kernel" / "kernel.py").read_text()
    assert "_get_shell_context_var(self._shell_parent_ident)" in source


def test_the_kernelspecs_are_package_data() -> None:
    """Found in the checkout here; in a wheel they are zeroboot_kernel/kernelspec (the matrix test
    installs one from a wheel outside the checkout)."""
    tool = PYPROJECT["tool"]["setuptools"]
    assert tool["package-dir"]["zeroboot_kernel.kernelspec"] == "kernelspec"
    assert "zeroboot_kernel.kernelspec" in tool["packages"]
    source = kernelspec_source()
    for name in KERNEL_NAMES:
        assert (source / name / "kernel.json").is_file()


def test_the_sdist_carries_the_engine_sources() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text().split("\n")
    assert "graft native" in manifest and "graft guest" in manifest
