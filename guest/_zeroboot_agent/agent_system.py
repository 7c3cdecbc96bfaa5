"""`!cmd` in the sandbox: the shell command runs as a guest process and its output streams to the cell.

IPython's own `system` (what ipykernel uses) runs the command under pexpect, on a pseudo-terminal;
the sandbox has no ptys yet (issue 15), so this runs `$SHELL -c cmd` on a pipe instead, with the same
results for the user: output and errors stream into the cell as they come (one stream, merged as a
terminal merges them), the exit status is IPython's (`_exit_code`: the code, or minus the signal),
and an interrupt stops the command (the sandbox's SIGINT reaches the agent's whole process group, as
Ctrl-C does in a terminal) and, as under ipykernel, the cell then ends normally (no KeyboardInterrupt:
IPython's system swallows it after sending ^C to the command). Line ends are a terminal's: each "\n" comes out as "\r\n", as
the pty's ONLCR mode makes it under ipykernel. What differs: the command's stdout is not a terminal
(`ls` prints one name per line, colours are off), and its stdin is /dev/null (ipykernel's pty
would wait for input that never comes).
"""
from __future__ import annotations

import codecs
import locale
import os
import signal
import subprocess
import sys

# How long an interrupted command may take to end by itself before it is killed (IPython's
# terminate_timeout is 0.2 s; a guest process can be slower to reach its handler).
_INTERRUPT_GRACE_S = 1.0
_READ_SIZE = 65536


def _shell() -> str:
    """IPython's choice: $SHELL if set, else sh (the system view's /bin/sh)."""
    return os.environ.get("SHELL") or "/bin/sh"


def _exit_code(returncode: int) -> int:
    """pexpect's convention as IPython returns it: a signal is negative, and so is sh's 128 + n."""
    if returncode > 128:
        return -(returncode - 128)
    return returncode


def run_streamed(cmd: str) -> int:
    """Run cmd with the shell, copying its output to sys.stdout as it arrives; its exit code."""
    decoder = codecs.getincrementaldecoder(locale.getpreferredencoding(False) or "utf-8")("replace")
    proc = subprocess.Popen([_shell(), "-c", cmd], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        while chunk := os.read(fd, _READ_SIZE):
            sys.stdout.write(decoder.decode(chunk.replace(b"\n", b"\r\n")))  # the pty's ONLCR
            sys.stdout.flush()
        sys.stdout.write(decoder.decode(b"", final=True))
        return _exit_code(proc.wait())
    except KeyboardInterrupt:
        # The command got the same SIGINT (same process group); give it a moment to end, then kill it.
        try:
            proc.wait(timeout=_INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return _exit_code(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)
    finally:
        proc.stdout.close()
