"""Shared fixtures, and which tests need /dev/kvm.

Without a usable /dev/kvm only the tests that need it are skipped. A test needs it when it is
marked `kvm`, or uses a fixture that boots guests (KVM_FIXTURES), or lives in a module that is not
marked `without_kvm`: most modules here run guests, so that is the default, and a module of host-side
units says `pytestmark = pytest.mark.without_kvm` (its few tests that still start a kernel or an
engine by hand are marked `kvm`).
"""
from __future__ import annotations

import errno
import fcntl
import os

import pytest

KVM_GET_API_VERSION = 0xAE00  # _IO(KVMIO, 0x00)
KVM_API_VERSION = 12
KVM_FIXTURES = frozenset({"template"})  # fixtures that boot guests


def kvm_unavailable() -> str | None:
    """Why /dev/kvm cannot run guests here, or None when it can. Opening it and asking its API
    version is what the engine does first (a check of the mode bits alone says yes to root)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"/dev/kvm: {errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc.strerror})"
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
    except OSError as exc:
        return f"/dev/kvm is not a KVM device: {exc.strerror}"
    finally:
        os.close(fd)
    return None if version == KVM_API_VERSION else f"/dev/kvm has KVM API version {version}, not {KVM_API_VERSION}"


def needs_kvm(item: pytest.Item) -> bool:
    if item.get_closest_marker("kvm") is not None:
        return True
    if KVM_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    return item.get_closest_marker("without_kvm") is None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kvm: the test needs /dev/kvm (boots guests, starts an engine or a kernel)")
    config.addinivalue_line("markers", "without_kvm: the test (or module) does not need /dev/kvm")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = kvm_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs /dev/kvm: {reason}")
    for item in items:
        if needs_kvm(item):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def template():
    """The default template (built on first use), shared by a module's sessions and forks."""
    from zeroboot_kernel.template import Template  # imported here: the tests without KVM need no engine
    return Template.ensure()


@pytest.fixture
def s(template):
    """A session of the default template for one test (closed after it)."""
    from zeroboot_kernel.session import Session
    session = Session(template)
    yield session
    session.close()
