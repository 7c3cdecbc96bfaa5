"""zeroboot's ZB_SYS_STAT_MANY (guest/guest_abi.h) and IPython's autoreload on it (issue 24):
many stats in one VM exit, each the answer stat(2) gives, and `%autoreload 2` checking every
module's mtime before each cell without an exit per module, still seeing a module edited on the
host."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from guest_abi import abi
from session_helpers import cell, ok
from zeroboot_kernel.session import Session

# a cell prelude: the raw syscall, as user code (or a hostile cell) can make it
RAW = (f"import ctypes, errno, os, json\nNR, MAX = {abi('ZB_SYS_STAT_MANY')}, {abi('ZB_STAT_MANY_MAX')}\n"
       "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
       "def raw(paths, n, out, errs, flags=0):\n"
       "    rc = libc.syscall(ctypes.c_long(NR), paths, ctypes.c_long(n), out, errs, ctypes.c_long(flags))\n"
       "    return rc if rc >= 0 else -ctypes.get_errno()\n")

STAT_FIELDS = ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime",
               "st_ctime", "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blksize", "st_blocks", "st_rdev")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    d = tmp_path / "nb"
    d.mkdir()
    (d / "helper.py").write_text("ANSWER = 42\n")
    (d / "sub").mkdir()
    (d / "link").symlink_to("helper.py")
    (d / "dangling").symlink_to("missing")
    return d


@pytest.fixture
def s(template, project: Path):
    session = Session(template, project_dir=str(project))
    yield session
    session.close()


# a cell prelude: the agent's module as `sa`
STAT_AHEAD = "import sys\nsa = next(m for k, m in sys.modules.items() if k.endswith('agent_stat_ahead'))\n"


def test_each_answer_is_what_os_stat_gives(s: Session) -> None:
    # files, a directory, a symlink (followed), a dangling one, a missing name, a path through a
    # file, the view of the Python installation, /proc, the overlay /tmp, a relative path
    out = ok(cell(s, STAT_AHEAD + "import json, os\n"
                     "open('/tmp/made', 'w').write('x' * 5000)\n"
                     f"fields = {STAT_FIELDS!r}\n"
                     "paths = ['helper.py', 'sub', 'link', 'dangling', 'nope', 'helper.py/x', os.__file__, '/proc/self/status',"
                     " '/tmp/made', '/', '.', '', 'a' * 5000]\n"
                     "answers = sa.stat_many(paths)\n"
                     "def expected(p):\n"
                     "    try:\n"
                     "        st = os.stat(p)\n"
                     "    except OSError as e:\n"
                     "        return e.errno\n"
                     "    return [getattr(st, f) for f in fields]\n"
                     "def got(a):\n"
                     "    return a if isinstance(a, int) else [getattr(a, f) for f in fields]\n"
                     "print(json.dumps([[p[:20], got(answers[p]), expected(p)] for p in paths]))\n"))
    rows = json.loads(out.strip().splitlines()[-1])
    assert len(rows) == 13
    for path, got, expected in rows:
        if path.startswith("/proc"):  # its times are the moment of the call
            got, expected = got[:7], expected[:7]
        assert got == expected, path
    errnos = {p: g for p, g, _ in rows if isinstance(g, int)}
    assert errnos == {"dangling": 2, "nope": 2, "helper.py/x": 20, "": 2, "a" * 20: 36}, errnos


def test_hostile_arguments_get_linux_errors_not_a_crash(s: Session) -> None:
    out = ok(cell(s, RAW +
                  "one = (ctypes.c_char_p * 1)(b'helper.py')\n"
                  "st = ctypes.create_string_buffer(144 * (MAX + 1))\n"
                  "errs = (ctypes.c_int32 * (MAX + 1))()\n"
                  "many = (ctypes.c_char_p * (MAX + 1))(*([b'helper.py'] * (MAX + 1)))\n"
                  "bad_ptr = (ctypes.c_uint64 * 2)(0x10, 0x7f0000000000)\n"
                  "r = {}\n"
                  "r['too_many'] = raw(many, MAX + 1, st, errs)\n"
                  "r['max'] = raw(many, MAX, st, errs)\n"
                  "r['flags'] = raw(one, 1, st, errs, flags=0x100)\n"
                  "r['paths_unmapped'] = raw(ctypes.c_void_p(0x7f0000000000), 1, st, errs)\n"
                  "r['out_unmapped'] = raw(one, 1, ctypes.c_void_p(0x7f0000000000), errs)\n"
                  "r['out_low_region'] = raw(one, 1, ctypes.c_void_p(0xe000), errs)\n"
                  "r['errs_unmapped'] = raw(one, 1, st, ctypes.c_void_p(0x10))\n"
                  "r['zero'] = raw(one, 0, None, None)\n"
                  "r['bad_path'] = [raw(bad_ptr, 2, st, errs), errs[0], errs[1]]\n"
                  "r['huge_n'] = raw(one, 2**63, st, errs)\n"
                  "print(json.dumps(r))\n"))
    r = json.loads(out.strip().splitlines()[-1])
    EINVAL, EFAULT = 22, 14
    assert r == {"too_many": -EINVAL, "max": abi("ZB_STAT_MANY_MAX"), "flags": -EINVAL, "paths_unmapped": -EFAULT,
                 "out_unmapped": -EFAULT, "out_low_region": -EFAULT, "errs_unmapped": -EFAULT, "zero": 0,
                 "bad_path": [2, EFAULT, EFAULT], "huge_n": -EINVAL}, r
    assert ok(cell(s, "print(open('helper.py').read())", 2)) == "ANSWER = 42\n\n"  # the sandbox goes on


def test_a_path_outside_the_view_is_not_found_as_with_stat(s: Session, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"  # a host file the sandbox does not show
    secret.write_text("no")
    paths = [str(secret), "/tmp/../" + str(secret), "../../" + str(secret)]
    out = ok(cell(s, STAT_AHEAD + "import json, os\n"
                     f"paths = {paths!r}\n"
                     "def err(p):\n"
                     "    try:\n"
                     "        os.stat(p)\n"
                     "    except OSError as e:\n"
                     "        return e.errno\n"
                     "answers = sa.stat_many(paths)\n"
                     "print(json.dumps([[answers[p], err(p)] for p in paths]))"))
    assert json.loads(out.strip().splitlines()[-1]) == [[2, 2]] * 3


def test_autoreload_checks_every_module_in_one_exit(s: Session) -> None:
    ok(cell(s, "%load_ext autoreload\n%autoreload 2\nimport helper\nhelper.ANSWER"))
    before = s.sandbox.guest.stats()["syscalls"]
    ok(cell(s, "x = 1", 2))
    calls = s.sandbox.guest.stats()["syscalls"] - before
    # one stat per module (~1,000) before; now the cell's few and the one batch
    assert calls < 50, calls
    out = ok(cell(s, "import sys\nprint(len(sys.modules) > 500)", 3))
    assert out.strip() == "True"


def test_autoreload_sees_a_module_edited_on_the_host(s: Session, project: Path) -> None:
    assert cell(s, "%load_ext autoreload\n%autoreload 2\nimport helper\nhelper.ANSWER")["result"] == "42"
    helper = project / "helper.py"
    helper.write_text("ANSWER = 44\n")  # as JupyterLab's editor saves it, between two cells
    st = helper.stat()
    os.utime(helper, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # later than the import, whatever the clock
    assert cell(s, "helper.ANSWER", 2)["result"] == "44"
    # and a module removed on the host: autoreload skips it (its stat fails), as under ipykernel
    helper.unlink()
    r = cell(s, "helper.ANSWER", 3)
    assert r["status"] == "ok" and r["result"] == "44", r


def test_one_call_looks_each_directory_up_on_the_host_once(s: Session) -> None:
    # the standard library's encodings package: ~120 files below the same few directories of the
    # read-only Python view; each path then costs its own lstat, not one per directory above it
    ok(cell(s, STAT_AHEAD + "import encodings, glob, os\n"
               "paths = sorted(glob.glob(os.path.dirname(encodings.__file__) + '/*.py'))\n"
               "assert len(paths) > 50, len(paths)\nsa.stat_many(paths)"))
    s.sandbox.guest.set_profile(True)
    try:
        out = ok(cell(s, "answers = sa.stat_many(paths)\nprint(len(paths), sum(isinstance(a, int) for a in answers.values()))", 2))
    finally:
        s.sandbox.guest.set_profile(False)
    n, failed = map(int, out.split())
    assert failed == 0
    calls = s.sandbox.guest.syscall_profile_by_number()["zb_stat_many"]
    assert calls["calls"] == 1
    assert calls["host_calls"] <= n + 8, (calls["host_calls"], n)  # one per path, a few for the directories
