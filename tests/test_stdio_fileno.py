"""sys.stdout and sys.stderr have file descriptors, as ipykernel's OutStream has (its fileno() is a
copy of the kernel's own fd): faulthandler, `subprocess.run(..., stdout=sys.stdout)` and libraries
that ask for the descriptor work instead of failing with `io.UnsupportedOperation`. Here the
descriptors are the process's fd 1 and 2, whose output the host streams to the running cell, so
what is written there shows in the notebook (ipykernel sends it to the kernel's terminal)."""
from __future__ import annotations

from session_helpers import run
from zeroboot_kernel.session import Session


def test_stdio_descriptors_work_and_reach_the_cell(s: Session) -> None:
    stderr: list[str] = []
    reply = run(s, "import faulthandler, subprocess, sys\n"
                   "print(sys.stdout.fileno(), sys.stderr.fileno())\n"
                   "sys.stdout.flush()\n"
                   "subprocess.run(['echo', 'a child writing to sys.stdout'], stdout=sys.stdout, check=True)\n"
                   "faulthandler.dump_traceback(all_threads=False)\n"
                   "faulthandler.dump_traceback_later(60)\n"
                   "faulthandler.cancel_dump_traceback_later()\n"
                   "faulthandler.enable()\n"
                   "print(faulthandler.is_enabled())\n"
                   "faulthandler.disable()", 1, stderr)
    assert reply["status"] == "ok", reply
    assert reply["stdout"].split("\n")[:2] == ["1 2", "a child writing to sys.stdout"], reply["stdout"]
    assert reply["stdout"].rstrip().endswith("True"), reply["stdout"]
    err = "".join(stderr)
    assert "Stack (most recent call first):" in err and 'File "' in err, err
