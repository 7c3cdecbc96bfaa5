"""Python inside the guest sees only its view, cannot change the host, and keeps nothing between
runs. Each test runs a script in a fresh sandbox; the script reports what it could do as JSON."""
from __future__ import annotations

import io
import json
import os
import re
import sys
import textwrap
import uuid

import pytest

from zeroboot_kernel.guest_view import IDENTITY_FILES, python_spec, python_view, system_view
from zeroboot_kernel.runner import run_to_completion

PRELUDE = '''
import errno, json, os, sys
results = {}
def attempt(name, fn):
    try:
        value = fn()
        results[name] = ["ok", value if isinstance(value, (str, int, list, bool, type(None))) else repr(value)]
    except OSError as e:
        results[name] = ["error", errno.errorcode.get(e.errno, e.errno)]
def read(path, **kw):
    with open(path, **kw) as f:
        return f.read()
def write(path, text="x"):
    with open(path, "w") as f:
        f.write(text)
    return "written"
'''


def run_guest(code: str, extra_view: list[str] | None = None) -> dict:
    out, err = io.BytesIO(), io.BytesIO()
    script = PRELUDE + textwrap.dedent(code) + "\nprint('RESULTS=' + json.dumps(results))\n"
    status = run_to_completion(python_spec(["-c", script], extra_view=extra_view), timeout=120, stdout=out, stderr=err)
    text = out.getvalue().decode()
    assert status == 0, err.getvalue().decode()
    return json.loads(text.split("RESULTS=", 1)[1])


def failed(result) -> bool:
    return result[0] == "error"


@pytest.fixture
def marker_dir(tmp_path):
    """A host directory visible (read-only) in the guest, with host symlinks pointing out of it."""
    d = tmp_path / "visible"
    d.mkdir()
    (d / "data.txt").write_text("visible data")
    os.symlink("/etc/shadow", d / "to_shadow")
    os.symlink("../../../../../../../../etc/shadow", d / "up_to_shadow")
    os.symlink(str(tmp_path), d / "to_parent")
    (tmp_path / "hidden.txt").write_text("not in the view")
    return d


def test_host_secrets_are_invisible():
    r = run_guest('''
        attempt("shadow", lambda: read("/etc/shadow"))
        attempt("shadow_dotdot", lambda: read("/usr/../etc/shadow"))
        attempt("passwd_dotdot", lambda: read("/usr/../etc/passwd"))
        attempt("passwd_many_dotdots", lambda: read("/../../../etc/../etc/./passwd"))
        attempt("hostname", lambda: read("/etc/hostname"))
        attempt("root_listing", lambda: sorted(os.listdir("/root")))
        attempt("ssh", lambda: os.listdir("/root/.ssh"))
        attempt("home_root", lambda: os.listdir("/home"))
        attempt("dev", lambda: sorted(os.listdir("/dev")))
        attempt("sys", lambda: os.listdir("/sys"))
        attempt("var", lambda: os.listdir("/var"))
        attempt("top", lambda: sorted(os.listdir("/")))
    ''')
    assert failed(r["shadow"]) and failed(r["shadow_dotdot"]) and failed(r["ssh"])
    assert failed(r["sys"]) and failed(r["var"])
    # /etc/passwd is the guest's own identity file, never the host's
    assert r["passwd_dotdot"] == ["ok", IDENTITY_FILES["/etc/passwd"].decode()]
    assert r["passwd_many_dotdots"] == r["passwd_dotdot"]
    assert r["hostname"] == ["ok", "zeroboot\n"]
    assert r["root_listing"] == ["ok", sorted({p.split("/")[2] for p in python_view() if p.startswith("/root/")})]
    assert r["home_root"] == ["ok", ["sandbox"]]
    assert r["dev"] == ["ok", ["null", "ptmx", "pts", "random", "shm", "ttyS0", "urandom", "zero"]]
    # the view's top-level directories (the Python view's and the system view's), and those its
    # host symlinks lead to (/lib -> usr/lib)
    view = list(python_view()) + system_view()
    top = {p.split("/")[1] for p in view + [os.path.realpath(p) for p in view]} | {"dev", "proc", "tmp", "home", "etc"}
    assert r["top"] == ["ok", sorted(top)]


SYNTHESISED_PROC = ("/proc/self/maps", "/proc/self/status", "/proc/cpuinfo", "/proc/meminfo", "/proc/self/cmdline", "/proc/mounts",
                    "/proc/1/cmdline")


def test_proc_shows_only_exe_and_synthesised_files():
    """/proc has the executable's link and the files libraries read about their process, written by
    the engine in guest terms (fs_proc.c), for the sandbox's own processes only (here pid 1, the
    agent: its argv in cmdline); nothing else of the host's /proc."""
    r = run_guest('''
        attempt("exe", lambda: os.readlink("/proc/self/exe"))
        attempt("self", lambda: sorted(os.listdir("/proc/self")))
        attempt("proc", lambda: sorted(os.listdir("/proc")))
        for p in ["/proc/self/maps", "/proc/self/environ", "/proc/self/cmdline", "/proc/self/status",
                  "/proc/self/mem", "/proc/self/root/etc/shadow", "/proc/self/cwd", "/proc/1/cmdline",
                  "/proc/1/root", "/proc/cpuinfo", "/proc/meminfo", "/proc/mounts"]:
            attempt(p, lambda p=p: read(p))
        attempt("fd_links", lambda: [[n, os.readlink("/proc/self/fd/" + n)] for n in os.listdir("/proc/self/fd")
                                     if os.path.lexists("/proc/self/fd/" + n)])
        attempt("exe_dotdot", lambda: read("/proc/self/exe/../../../etc/shadow"))
        attempt("cwd_dotdot", lambda: read("/proc/self/cwd/../../etc/shadow"))
        attempt("fd_dotdot", lambda: read("/proc/self/fd/0/../../etc/shadow"))
        attempt("fd_far", lambda: read("/proc/self/fd/99999"))
        attempt("stdin", lambda: [os.readlink("/proc/self/fd/0"), read("/proc/self/fd/0")])
    ''')
    assert r["exe"][0] == "ok" and r["exe"][1].endswith("python3.11")
    assert r["self"] == ["ok", ["cgroup", "cmdline", "cwd", "exe", "fd", "fdinfo", "maps", "mountinfo", "mounts",
                                "smaps_rollup", "stat", "statm", "status"]]
    # the process's own fds, each named in guest terms: a guest path, or a pipe, socket or anonymous
    # file by number (never a host fd, pid or path the view does not show)
    assert r.pop("stdin") == ["ok", ["/dev/null", ""]]  # the process's own stdin, as on Linux
    links = r.pop("fd_links")
    assert links[0] == "ok" and {fd for fd, _ in links[1]} >= {"0", "1", "2"}
    for fd, target in links[1]:
        assert re.fullmatch(r"(pipe|socket):\[\d+\]|anon_inode:\[[a-z ]+\]|/dev/\w+|/tmp/\S*|/home/sandbox\S*", target) or \
            target.startswith(sys.prefix), (fd, target)
    assert r["proc"] == ["ok", ["1", "cpuinfo", "meminfo", "mounts", "self", "stat", "uptime"]]
    host = open("/proc/self/status").read()
    for name, result in r.items():
        if name in SYNTHESISED_PROC:
            assert result[0] == "ok" and result[1] and result[1] not in host, (name, result)
            assert f"\t{os.getpid()}\n" not in result[1]  # no host pid
        elif name.startswith("/proc") or name in ("exe_dotdot", "cwd_dotdot", "fd_dotdot", "fd_far"):
            assert failed(result), (name, result)


def test_symlinks_and_dirfds_cannot_escape(marker_dir):
    r = run_guest(f'''
        os.symlink("/etc/shadow", "/tmp/abs")
        os.symlink("../../../../../../etc/shadow", "/tmp/rel")
        os.symlink("/", "/tmp/rootlink")
        os.symlink("..", "/tmp/up")
        attempt("abs", lambda: read("/tmp/abs"))
        attempt("rel", lambda: read("/tmp/rel"))
        attempt("via_root", lambda: read("/tmp/rootlink/etc/shadow"))
        attempt("via_up", lambda: read("/tmp/up/tmp/up/../../etc/shadow"))
        attempt("up_listing", lambda: sorted(os.listdir("/tmp/up/tmp/up/../..")) == sorted(os.listdir("/")))
        tmp = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
        attempt("dirfd", lambda: os.open("../../etc/shadow", os.O_RDONLY, dir_fd=tmp))
        attempt("dirfd_deep", lambda: os.open("../../../../../../../../etc/shadow", os.O_RDONLY, dir_fd=tmp))
        attempt("dirfd_hostname", lambda: os.read(os.open("../../../../etc/hostname", os.O_RDONLY, dir_fd=tmp), 100).decode())
        d = {str(marker_dir)!r}
        attempt("visible", lambda: read(d + "/data.txt"))
        attempt("host_link_abs", lambda: read(d + "/to_shadow"))
        attempt("host_link_rel", lambda: read(d + "/up_to_shadow"))
        attempt("host_link_parent", lambda: read(d + "/to_parent/hidden.txt"))
        attempt("host_sibling", lambda: read(d + "/../hidden.txt"))
        attempt("parent_listing", lambda: os.listdir(d + "/.."))
    ''', extra_view=[str(marker_dir)])
    for name in ("abs", "rel", "via_root", "via_up", "dirfd", "dirfd_deep", "host_link_abs", "host_link_rel",
                 "host_link_parent", "host_sibling"):
        assert failed(r[name]), (name, r[name])
    assert r["up_listing"] == ["ok", True]  # '..' from the root is the root
    assert r["dirfd_hostname"] == ["ok", "zeroboot\n"]
    assert r["visible"] == ["ok", "visible data"]
    assert r["parent_listing"] == ["ok", ["visible"]]  # only the path leading to the view


def test_the_host_does_not_change(marker_dir):
    marker = f"zeroboot-marker-{uuid.uuid4().hex}"
    view_file = marker_dir / "data.txt"
    before = view_file.stat()
    host_targets = [f"/tmp/{marker}", f"/root/{marker}", f"{marker_dir}/{marker}", f"/{marker}",
                    f"{os.path.dirname(os.__file__)}/{marker}"]
    r = run_guest(f'''
        marker, d = {marker!r}, {str(marker_dir)!r}
        for i, path in enumerate({host_targets!r}):
            attempt(f"write{{i}}", lambda path=path: write(path))
            attempt(f"mkdir{{i}}", lambda path=path: os.mkdir(path + ".d"))
        os.symlink(d, "/tmp/to_view")
        attempt("via_symlink", lambda: write("/tmp/to_view/" + marker))
        attempt("overwrite", lambda: write(d + "/data.txt", "changed"))
        attempt("append", lambda: open(d + "/data.txt", "a"))
        attempt("unlink", lambda: os.unlink(d + "/data.txt"))
        attempt("rename", lambda: os.rename(d + "/data.txt", "/tmp/moved"))
        attempt("chmod", lambda: os.chmod(d + "/data.txt", 0o777))
        attempt("utime", lambda: os.utime(d + "/data.txt", (0, 0)))
        attempt("truncate", lambda: os.truncate(d + "/data.txt", 0))
        attempt("rmdir", lambda: os.rmdir(d))
        attempt("symlink_in_view", lambda: os.symlink("/tmp", d + "/link"))
        attempt("readback", lambda: read(d + "/data.txt"))
    ''', extra_view=[str(marker_dir)])
    # the guest's own /tmp is private: writing there works, but never reaches the host's /tmp
    assert r["write0"] == ["ok", "written"] and r["mkdir0"][0] == "ok"
    for name, result in r.items():
        if name not in ("write0", "mkdir0", "readback"):
            assert failed(result), (name, result)
    assert r["overwrite"] == ["error", "EROFS"] and r["rename"] == ["error", "EROFS"]
    assert r["readback"] == ["ok", "visible data"]
    for path in host_targets:
        assert not os.path.lexists(path) and not os.path.lexists(path + ".d"), path
    assert sorted(os.listdir(marker_dir)) == ["data.txt", "to_parent", "to_shadow", "up_to_shadow"]
    after = view_file.stat()
    assert (after.st_mtime_ns, after.st_mode, after.st_size) == (before.st_mtime_ns, before.st_mode, before.st_size)
    assert view_file.read_text() == "visible data"


def test_nothing_persists_between_runs():
    first = run_guest('''
        attempt("tmp", lambda: write("/tmp/persist.txt", "from run 1"))
        attempt("home", lambda: write(os.path.expanduser("~/persist.txt"), "from run 1"))
        attempt("env", lambda: os.environ.setdefault("ZB_PERSIST", "1"))
    ''')
    assert first["tmp"] == ["ok", "written"] and first["home"] == ["ok", "written"]
    second = run_guest('''
        attempt("tmp", lambda: os.path.exists("/tmp/persist.txt"))
        attempt("home", lambda: os.path.exists(os.path.expanduser("~/persist.txt")))
        attempt("listing", lambda: sorted(os.listdir("/tmp")))
        attempt("env", lambda: "ZB_PERSIST" in os.environ)
    ''')
    # /tmp holds nothing of run 1; only what the view puts there (a checkout under /tmp, say)
    view_in_tmp = sorted({p.split("/")[2] for p in python_view() if p.startswith("/tmp/")})
    assert second == {"tmp": ["ok", False], "home": ["ok", False], "listing": ["ok", view_in_tmp], "env": ["ok", False]}
