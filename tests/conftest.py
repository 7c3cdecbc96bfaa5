"""Shared fixtures. Tests need /dev/kvm and the built engine, except those in modules marked
`pytest.mark.without_kvm` (pure host-side units, and the test of the error without /dev/kvm): without
/dev/kvm the rest are skipped, and those still run."""
from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "without_kvm: the test does not need /dev/kvm")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        return
    skip = pytest.mark.skip(reason="/dev/kvm is not available")
    for item in items:
        if item.get_closest_marker("without_kvm") is None:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def template():
    """The default template (built on first use), shared by a module's sessions and forks."""
    from zeroboot_kernel.template import Template  # imported here: the tests without KVM need no engine
    return Template.ensure()
