"""execve and execveat in one guest process (issue 15; no fork): programs of the read-only system
view, `#!` scripts, Linux's errors with the caller going on, close-on-exec, signal dispositions,
exec from a thread, and hostile inputs (guest_programs/exec.c). The checks that are Linux's
behaviour also run, with the same binary, on the host."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import guest_c
from zeroboot_kernel.errors import SandboxCrashed
from zeroboot_kernel.guest_view import SystemViewError, system_view
from zeroboot_kernel.native import EventKind

# The system view as the kernel's sandboxes get it, so that /bin/echo, /bin/sh and their loader and
# libraries resolve in the guest (plus ld.so's cache, which the Python view brings).
VIEW = [*system_view(), "/etc/ld.so.cache"]

# Tests whose program execs itself (or a script) and passes in the new image.
IN_NEW_IMAGE = ["script_args", "cloexec", "signals", "image", "zeroed", "thread", "fexecve", "setuid", "many_args"]
ERRORS = ["errors", "e2big", "efault"]


def run(*args: str) -> guest_c.GuestRun:
    return guest_c.run("exec", *args, view=VIEW)


def test_exec_of_a_dynamic_program_replaces_the_process_and_its_output_is_seen() -> None:
    result = run("echo")
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert result.out == "hello from execve\n"


@pytest.mark.parametrize("program, status", [("/bin/true", 0), ("/bin/false", 1)])
def test_exit_status_of_the_new_program_is_the_process_status(program: str, status: int) -> None:
    result = run("true", program)
    assert result.kind is EventKind.EXIT and result.status == status, result.describe()


# Programs of the system view the notebook idioms use, exec'ed by a static guest program, with what
# they print (the guest's /etc is its own: passwd, shells, ...). awk is Debian's alternatives link.
PROGRAMS = [
    (["/bin/cat", "/etc/hostname"], "zeroboot\n"),
    (["/bin/grep", "-c", "sandbox", "/etc/passwd"], "1\n"),
    (["/bin/sed", "s/boot/BOOT/", "/etc/hostname"], "zeroBOOT\n"),
    (["/usr/bin/awk", "BEGIN { print 6 * 7 }"], "42\n"),
    (["/usr/bin/head", "-1", "/etc/shells"], "/bin/sh\n"),
    (["/usr/bin/wc", "-l", "/etc/hostname"], "1 /etc/hostname\n"),
    (["/usr/bin/env"], None),
    (["/usr/bin/id", "-un"], "sandbox\n"),
    (["/bin/bash", "-c", "echo $((2**10))"], "1024\n"),
    (["/bin/sh", "-c", "command -v ls"], "/usr/bin/ls\n"),
    (["/bin/ls", "-d", "/usr/bin"], "/usr/bin\n"),
]


@pytest.mark.parametrize("argv, want", PROGRAMS, ids=[" ".join(a[:2]) for a, _ in PROGRAMS])
def test_programs_of_the_system_view_run(argv: list[str], want: str | None) -> None:
    result = run("run", *argv)
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    if want is not None:
        assert result.out == want, result.describe()
    else:
        assert "PATH=/usr/bin:/bin" in result.out, result.describe()


def test_shell_script_runs_through_its_interpreter() -> None:
    """#!/bin/sh with builtins only: $0 is the script's path, argv[1..] follow, its exit status."""
    result = run("script")
    assert result.kind is EventKind.EXIT and result.status == 3, result.describe()
    assert result.out == "script /tmp/zb-exec-1/script.sh first 42\n"


def test_sh_c_arithmetic() -> None:
    result = run("sh_c")
    assert result.kind is EventKind.EXIT and result.status == 0, result.describe()
    assert result.out == "42\n"


@pytest.mark.parametrize("test", ERRORS + IN_NEW_IMAGE)
def test_exec_semantics(test: str) -> None:
    guest_c.check("exec", test, view=VIEW)


def test_hostile_elf_files_are_refused_and_a_tiny_one_runs() -> None:
    """Truncated headers, program headers outside the file, huge, wrapping and overlapping
    segments, bad PT_INTERP paths and loaders: each is an error the caller survives; a
    hand-made 248-byte static ELF then runs and exits with 7."""
    result = run("hostile_elf")
    assert result.kind is EventKind.EXIT and result.status == 7, result.describe()
    assert "PASS hostile_elf" in result.out


@pytest.mark.parametrize("test", ["echo", "script", "sh_c", *ERRORS, *IN_NEW_IMAGE])
def test_same_program_passes_on_linux(test: str, tmp_path: Path) -> None:
    """The checks are Linux's behaviour, not the engine's: the same binary passes on the host."""
    binary = guest_c.build("exec")
    proc = subprocess.run([str(binary), test], capture_output=True, text=True, timeout=60,
                          env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    want = {"script": 3}.get(test, 0)
    assert proc.returncode == want, proc.stderr
    if test not in ("echo", "script", "sh_c"):
        assert f"PASS {test}" in proc.stdout, proc.stderr


# ---- the guest's CPython (a sandbox forked from the template, so with the kernel's view) ----

def _exec_cell(template, code: str) -> tuple[str, SandboxCrashed]:
    """Run a cell that replaces the agent by another program: its output, and how it ended (the
    agent is gone, so the Sandbox reports its exit)."""
    out: list[str] = []
    with template.fork() as sb:
        with pytest.raises(SandboxCrashed) as ended:
            sb.execute(code, on_stream=lambda name, text: out.append(text))
    return "".join(out), ended.value


def test_cpython_os_execv_runs_echo_in_place_of_the_agent(template) -> None:
    out, ended = _exec_cell(template, "import os, sys\nsys.stdout.flush()\n"
                                      "os.execv('/bin/echo', ['echo', 'hello', 'from', 'echo'])")
    assert "exited with status 0" in str(ended)
    assert "hello from echo\n" in out


def test_cpython_execs_sh_c_with_arithmetic(template) -> None:
    out, ended = _exec_cell(template, "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo $((6*7)); exit 42'])")
    assert "exited with status 42" in str(ended)
    assert "42\n" in out


def test_cpython_exec_errors_are_oserrors_and_the_agent_goes_on(template) -> None:
    with template.fork() as sb:
        r = sb.execute("import os\nerrs = []\n"
                       "for p in ('/nonexistent', '/tmp', '/etc/passwd'):\n"
                       "    try:\n        os.execv(p, [p])\n    except OSError as e:\n        errs.append(e.errno)\n"
                       "import errno\nerrs == [errno.ENOENT, errno.EACCES, errno.EACCES]")
        assert r.status == "ok" and r.result and r.result["text/plain"] == "True", r


# ---- the system view's policy (guest_view.py, docs/SECURITY.md "The system view") ----

def test_system_view_shows_usr_but_not_usr_local_and_refuses_host_data() -> None:
    view = system_view({})
    assert "/usr/bin" in view and not any(p == "/usr/local" or p.startswith("/usr/local/") for p in view)
    assert ("/etc/alternatives" in view) == os.path.isdir("/etc/alternatives")  # Debian's awk, which, ...
    assert system_view({"ZEROBOOT_SYSTEM_VIEW": "none"}) == []
    assert "/usr/local/bin" in system_view({"ZEROBOOT_SYSTEM_VIEW": "/usr/local/bin"})
    for bad in ("/", "/etc", "/home", "/root/x", "/var/lib", "relative/dir"):
        with pytest.raises(SystemViewError):
            system_view({"ZEROBOOT_SYSTEM_VIEW": f"/usr:{bad}"})


def test_the_guest_sees_the_system_view_read_only(template) -> None:
    with template.fork() as sb:
        r = sb.execute("import os, sys\n"
                       "usr_local = sorted(os.listdir('/usr/local')) if os.path.isdir('/usr/local') else []\n"
                       "python_there = os.path.realpath(sys.executable).startswith('/usr/local/')\n"
                       "try:\n    open('/usr/bin/zb-write-test', 'w')\n    wrote = True\n"
                       "except OSError:\n    wrote = False\n"
                       "(os.access('/bin/sh', os.X_OK), os.path.isfile('/usr/bin/env'), wrote,\n"
                       " python_there or usr_local == [], os.path.isfile('/etc/profile'),\n"
                       " os.path.exists('/etc/shadow'), os.path.exists('/var'))")
        assert r.status == "ok", r
        assert r.result and r.result["text/plain"] == "(True, True, False, True, True, False, False)", r.result


def test_bench_execve_measures_every_row() -> None:
    """`bench execve` end to end with two runs (no timing asserted: speed is the bench's business)."""
    from zeroboot_kernel.bench import execve
    res = execve.measure(runs=2)
    assert len(res["rows"]) == 5
    assert all(v["p50_ms"] > 0 and v["min_ms"] <= v["p90_ms"] for v in res["rows"].values()), res
    assert "guest: execve" in execve.markdown(res)


def test_execv_in_a_kernel_cell_streams_its_output_and_is_rolled_back() -> None:
    """Through a real kernel (the engine process under its run-phase seccomp filter): the guest's
    execve needs no new host rights; the program's output streams into the cell, its exit is the
    cell's error, and the session rolls back to the state before the cell."""
    from kernel_helpers import ensure_kernelspecs, execute, kernel, stream_text, value_of
    ensure_kernelspecs()
    with kernel() as (_km, kc):
        reply, _ = execute(kc, "x = 5")
        assert reply["status"] == "ok", reply
        reply, msgs = execute(kc, "import os, sys\nsys.stdout.flush()\n"
                                  "os.execv('/bin/sh', ['sh', '-c', 'echo from sh $((6*7)); exit 3'])")
        assert reply["status"] == "error" and "exited with status 3" in reply["evalue"], reply
        assert "from sh 42\n" in stream_text(msgs)
        assert value_of(kc, "x") == "5"
