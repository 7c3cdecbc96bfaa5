"""Shared fixtures: every test here needs /dev/kvm and the built engine."""
from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        return
    skip = pytest.mark.skip(reason="/dev/kvm is not available")
    for item in items:
        item.add_marker(skip)
