"""Without /dev/kvm every entry point fails at once with an error that says what to do."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.without_kvm,
              pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")]


def run_without_kvm(*args: str) -> subprocess.CompletedProcess:
    # a private mount namespace whose /dev has no kvm node
    script = "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && exec \"$@\""
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *args],
                          capture_output=True, text=True, timeout=120)


def test_run_reports_missing_kvm() -> None:
    r = run_without_kvm(sys.executable, "-m", "zeroboot_kernel", "run", "-c", "print(1)")
    assert r.returncode != 0
    assert "/dev/kvm does not exist" in r.stderr and "modprobe" in r.stderr


def test_api_reports_missing_kvm() -> None:
    code = ("from zeroboot_kernel.engine import Engine\n"
            "from zeroboot_kernel.errors import KvmUnavailableError\n"
            "try:\n    Engine()\nexcept KvmUnavailableError as e:\n    print('OK', e)\n")
    r = run_without_kvm(sys.executable, "-c", code)
    assert r.stdout.startswith("OK /dev/kvm does not exist"), r.stdout + r.stderr
