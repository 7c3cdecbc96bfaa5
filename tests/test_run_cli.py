"""`zeroboot-kernel run`: python in a fresh VM from the command line (issue 2's acceptance).

The CLI runs as `python -m zeroboot_kernel` (the same entry point as the `zeroboot-kernel`
script) with this checkout first on PYTHONPATH, so the code under test is this tree's.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def zb(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "zeroboot_kernel", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=ROOT)


def test_print():
    proc = zb("run", "-c", "print(1+1)")
    assert (proc.returncode, proc.stdout) == (0, "2\n"), proc.stderr


def test_numpy():
    proc = zb("run", "-c", "import numpy as np; print(np.arange(10).sum())")
    assert (proc.returncode, proc.stdout) == (0, "45\n"), proc.stderr


def test_stdlib_modules():
    code = ("import json, re, decimal, datetime, collections, math\n"
            "print(json.dumps({'a': [1, 2]}))\n"
            "print(re.sub(r'(\\d+)', r'<\\1>', 'a1b22'))\n"
            "print(decimal.Decimal(1) / decimal.Decimal(7))\n"
            "print(datetime.date(2024, 2, 28) + datetime.timedelta(days=1))\n"
            "print(collections.Counter('abracadabra').most_common(1))\n"
            "print(math.factorial(20), math.isclose(math.pi, 3.141592653589793))\n"
            "print(datetime.datetime.now().year >= 2024)\n")
    proc = zb("run", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        '{"a": [1, 2]}', "a<1>b<22>", "0.1428571428571428571428571429", "2024-02-29", "[('a', 5)]",
        "2432902008176640000 True", "True"]


def test_system_exit_status():
    assert zb("run", "-c", "raise SystemExit(3)").returncode == 3
    proc = zb("run", "-c", "import sys; sys.exit('bye')")
    assert proc.returncode == 1 and "bye" in proc.stderr


def test_uncaught_exception_prints_a_traceback():
    proc = zb("run", "-c", "def f():\n    raise ValueError('boom')\nf()")
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "in f" in proc.stderr and "ValueError: boom" in proc.stderr


def test_run_file_with_arguments(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(sys.argv[1:])\nprint(__file__ == sys.argv[0], __name__)\n")
    proc = zb("run", str(script), "one", "--two", "-c", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["['one', '--two', '-c', '3']", "True __main__"]


def test_run_module_with_arguments():
    proc = zb("run", "-m", "calendar", "2024", "2")
    assert proc.returncode == 0, proc.stderr
    assert "February 2024" in proc.stdout and "29" in proc.stdout
    # options after the module belong to it, not to zeroboot-kernel
    proc = zb("run", "-m", "json.tool", "-h")
    assert proc.returncode == 0, proc.stderr
    assert "--sort-keys" in proc.stdout


def test_options_before_the_program():
    proc = zb("run", "--memory", "512", "--env", "GREETING=hi", "-c",
              "import os, sys; print(os.environ['GREETING'], sys.argv[1:])", "-v", "x")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hi ['-v', 'x']\n"


def test_trace_syscalls_of_a_template_fork():
    proc = zb("run", "--trace-syscalls", "-c", "open('/etc/hostname').read()")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("zeroboot:")]  # build progress
    assert lines[0].startswith("read(0x"), lines[:3]  # the agent receiving the RUN frame
    assert any(re.match(r'openat\("/etc/hostname" 0x', line) for line in lines), lines
    assert lines[-1].startswith("exit_group(")


def test_trace_syscalls_of_a_fresh_interpreter():
    proc = zb("run", "--no-template", "--trace-syscalls", "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) > 20
    assert any(re.match(r'openat\("/.*" 0x', line) for line in lines), lines[:20]
    assert any(line.startswith("exit_group(") for line in lines)
    assert all(re.search(r"\[\d+\.\d us\]$", line) for line in lines if "(" in line and " = " in line)


def test_timeout_stops_an_endless_loop():
    start = time.monotonic()
    proc = zb("run", "--timeout", "1", "-c", "while True: pass", timeout=60)
    assert proc.returncode == 124
    assert "timeout" in proc.stderr
    assert time.monotonic() - start < 30  # not a speed check: the loop must not run on


def test_crash_reports_the_signal():
    proc = zb("run", "-c", "import os; os.abort()")
    assert proc.returncode == 128 + 6
    assert "SIGABRT" in proc.stderr


def test_large_output_is_complete():
    proc = zb("run", "-c", "import sys\nfor i in range(20000): print(i)\nsys.stdout.write('x' * 300000)")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:20000] == [str(i) for i in range(20000)] and lines[20000] == "x" * 300000


@pytest.mark.parametrize("args", [["run"], ["run", "/nonexistent/script.py"]])
def test_usage_errors(args):
    proc = zb(*args)
    assert proc.returncode == 2 and proc.stderr
