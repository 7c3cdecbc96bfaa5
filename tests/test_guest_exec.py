"""execve and execveat in one guest process (issue 15; no fork): programs of the read-only system
view, `#!` scripts, Linux's errors with the caller going on, close-on-exec, signal dispositions,
exec from a thread, and hostile inputs (guest_programs/exec.c). The checks that are Linux's
behaviour also run, with the same binary, on the host."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import guest_c
from zeroboot_kernel.native import EventKind

# The system view as the kernel's sandboxes get it (guest_view.system_view), so that /bin/echo,
# /bin/sh and their loader and libraries resolve in the guest.
VIEW = ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache"]

# Tests whose program execs itself (or a script) and passes in the new image.
IN_NEW_IMAGE = ["script_args", "cloexec", "signals", "image", "thread", "fexecve", "many_args"]
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
