"""memfd_create and seals, sendfile, copy_file_range, getpriority/setpriority, pipe sizes, whole
blocking pipe writes and resource limits of a guest with no CPython (guest_programs/syscall_gaps.c),
in the guest and on Linux, and their state across snapshots, saved templates and forks."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import guest_c

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["memfd", "seals", "sendfile", "copy_file_range", "priority", "pipe_size", "whole_write", "mknod", "rlimits"]


@pytest.mark.parametrize("test", TESTS)
def test_syscall_gaps(test: str) -> None:
    guest_c.check("syscall_gaps", test)


@pytest.mark.parametrize("test", TESTS)
def test_the_program_passes_on_linux(test: str) -> None:
    """The checks are Linux's behaviour, not the engine's: the same binary passes on the host."""
    guest_c.check_on_linux("syscall_gaps", test)


def test_memfd_pipe_size_and_nice_survive_snapshots_saves_and_forks(tmp_path):
    guest_c.check_state_survives_snapshots("syscall_gaps", tmp_path)


# The same Python code in the guest (`zeroboot-kernel run -c`) and on the host: memfd_create with a
# shared mapping across fork and seals, sendfile from a read-only host file (the os module's source:
# the view in the guest) into /tmp, copy_file_range within /tmp, nice, pipe sizes, and an unbuffered
# child's 1 MiB write through a pipe (whole blocking writes).
PYTHON_CHECK = r'''
import fcntl, mmap, os, subprocess, sys, tempfile
fd = os.memfd_create("check", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
st = os.fstat(fd)
print("memfd", os.get_inheritable(fd), st.st_nlink, oct(st.st_mode), st.st_size)
os.ftruncate(fd, 8192)
m = mmap.mmap(fd, 8192)
pid = os.fork()
if pid == 0:
    m[4096:4101] = b"child"
    os._exit(0)
print("wait", os.waitpid(pid, 0)[1])
print("shared", bytes(m[4096:4101]), os.pread(fd, 5, 4096))
m.close()
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK)
print("seals", fcntl.fcntl(fd, fcntl.F_GET_SEALS))
for call in (lambda: os.write(fd, b"x"), lambda: os.ftruncate(fd, 1)):
    try:
        call()
    except OSError as e:
        print("sealed", e.errno)
src = os.open(os.__file__, os.O_RDONLY)
size = os.fstat(src).st_size
d = tempfile.mkdtemp(dir="/tmp")
dst = os.open(os.path.join(d, "copy"), os.O_RDWR | os.O_CREAT, 0o600)
print("sendfile", os.sendfile(dst, src, None, 1 << 30) == size, os.lseek(src, 0, os.SEEK_CUR) == size)
print("sendfile offset", os.sendfile(dst, src, 10, 20), os.lseek(src, 0, os.SEEK_CUR) == size)
with open(os.__file__, "rb") as f:
    want = f.read()
print("same bytes", os.pread(dst, size, 0) == want)
dst2 = os.open(os.path.join(d, "copy2"), os.O_RDWR | os.O_CREAT, 0o600)
print("copy_file_range", os.copy_file_range(dst, dst2, 1000, 5, 0), os.pread(dst2, 1000, 0) == want[5:1005])
try:
    os.copy_file_range(dst, dst, 100, 0, 10)
except OSError as e:
    print("overlap", e.errno)
base = os.nice(0)
print("nice", os.nice(3) - base, os.getpriority(os.PRIO_PROCESS, 0) - base)
r, w = os.pipe()
print("pipe size", fcntl.fcntl(w, fcntl.F_GETPIPE_SZ), fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 100000),
      fcntl.fcntl(r, fcntl.F_GETPIPE_SZ))
out = subprocess.run([sys.executable, "-u", "-c", "import sys; sys.stdout.write('z' * (1 << 20))"],
                     stdout=subprocess.PIPE).stdout
print("child wrote", len(out))
'''


def test_python_level_results_equal_the_hosts():
    guest = zb_run("run", "-c", PYTHON_CHECK)
    assert guest.returncode == 0, guest.stderr
    host = subprocess.run([sys.executable, "-c", PYTHON_CHECK], capture_output=True, text=True, timeout=120)
    assert host.returncode == 0, host.stderr
    assert guest.stdout == host.stdout
    assert "shared b'child' b'child'" in guest.stdout and "child wrote 1048576" in guest.stdout


def zb_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "zeroboot_kernel", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=ROOT)


def test_a_lowered_hard_limit_cannot_be_raised_again(template) -> None:
    """The guest has no privilege: raising a hard limit is EPERM (ValueError in Python), as for an
    unprivileged Linux user (the host's root may, so this runs in the guest only)."""
    with template.fork() as sb:
        r = sb.execute("import resource\nsoft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
                       "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))\n"
                       "try:\n    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
                       "except ValueError as e:\n    print('refused:', e)\n"
                       "print(resource.getrlimit(resource.RLIMIT_NOFILE))")
        assert r.status == "ok" and r.stdout == "refused: not allowed to raise maximum limit\n(256, 512)\n", r
