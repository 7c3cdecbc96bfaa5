"""The guest's clocks are the host's (native/vdso_page.c): the vDSO computes them from the TSC and a
data page the engine rewrites each time a sandbox starts running, from the host's clocks and the
guest's TSC at that moment (read without an ioctl, from the vCPU's TSC offset: kvm_vm.c
learn_tsc_offset). A reading inside a cell must therefore lie between the host's readings before
and after the cell, on process 1's executor VM and on a child process's."""
from __future__ import annotations

import time
from typing import Any

READ = "import os, time\nprint(time.monotonic_ns(), time.time_ns())"

CHILD = """
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, f"{time.monotonic_ns()} {time.time_ns()}".encode())
    os._exit(0)
os.close(w)
child = os.read(r, 100).decode()
os.waitpid(pid, 0)
print(child)
"""


def _bracketed(sb: Any, code: str) -> None:
    before_mono, before_real = time.monotonic_ns(), time.time_ns()
    r = sb.execute(code)
    after_mono, after_real = time.monotonic_ns(), time.time_ns()
    assert r.status == "ok", r.stderr
    mono, real = (int(x) for x in r.stdout.split())
    assert before_mono <= mono <= after_mono, (before_mono, mono, after_mono)
    # CLOCK_REALTIME can be stepped by the host (NTP) between the reads: allow a second
    assert before_real - 10**9 <= real <= after_real + 10**9, (before_real, real, after_real)


def test_the_guests_clocks_lie_within_the_cell_on_the_host(template: Any) -> None:
    with template.fork() as sb:
        for pause in (0.0, 0.3, 0.0):
            _bracketed(sb, READ)
            time.sleep(pause)   # the host's time moves on while the sandbox is not running


def test_a_child_processs_clocks_lie_within_the_cell_on_the_host(template: Any) -> None:
    with template.fork() as sb:
        sb.execute("import os, time")
        for _ in range(3):   # the children's executor VM, new and then warm
            _bracketed(sb, CHILD)
