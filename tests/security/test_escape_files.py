"""Escape battery, files: a guest (guest/escape_files.c, raw syscalls) tries to read host files
outside its view, to change the view, to leave the notebook's folder in each files mode, to abuse
/dev/ttyS0, to crash the engine through a host file that shrinks under a mapping, and to open
special files the host left in the folder. See docs/SECURITY.md for the table of outcomes."""
from __future__ import annotations

import os
import secrets
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import battery
import guest_c
from zeroboot_kernel.native import EventKind


@pytest.fixture
def host(tmp_path):
    """A secret outside the view, and a view directory with host symlinks pointing out of it."""
    token = "TOKEN-" + secrets.token_hex(12)
    (tmp_path / "secret.txt").write_text(token)
    view = tmp_path / "view"
    view.mkdir()
    (view / "data.txt").write_text("visible data")
    os.symlink(str(tmp_path / "secret.txt"), view / "to_secret")
    os.symlink("../secret.txt", view / "up_to_secret")
    return tmp_path, view, token


# attempts that succeed by design: the guest's own objects, or listings of what it may see
READ_OK = {"view_parent_listing", "readlink_overlay", "readlink_proc_exe", "dev_listing", "pts_listing", "proc_self_listing",
           "/proc/self/fd/0"}  # the program's own stdin (/dev/null here), through the link to it
# written by the engine in guest terms when opened (native/fs_proc.c), never the host's: the
# guest's own addresses, one CPU, and its own argv (the program the battery ran, with its mode)
SYNTHESISED = {"/proc/self/maps": "000000400000-", "/proc/cpuinfo": "processor\t: 0",
               "/proc/self/cmdline": str(guest_c.BIN_DIR / "escape_files-")}


def test_reads_outside_the_view_fail(host):
    root, view, token = host
    r = battery.run("escape_files", "read", str(root / "secret.txt"), str(view), view=[str(view)])
    battery.completed(r, "read")
    got = battery.attempts(r)
    assert len(got) >= 75, r.out
    assert token not in r.out and token not in r.err
    for name, (outcome, detail) in got.items():
        if name in READ_OK or name.startswith("fd_"):
            continue
        if name in SYNTHESISED:
            text = detail.encode().decode("unicode_escape")
            assert outcome == "ok" and text.startswith(SYNTHESISED[name]), (name, detail)
            assert f"\t{os.getpid()}\n" not in text and f" {os.getpid()} " not in text, (name, detail)
            continue
        assert outcome == "err", (name, detail)
    assert got["view_parent_listing"] == ("ok", ".,..,view,")  # only the path that leads to the view
    assert got["/proc/self/fd/0"] == ("ok", "")
    # shm: the guest's own in-memory /dev/shm (an overlay directory), never the host's; ptmx: the
    # sandbox's own pty multiplexer (file_pty.c), never the host's; pts: the sandbox's own ptys
    # (none open here, so only its mode-0000 ptmx), never the host's
    assert got["dev_listing"] == ("ok", ".,..,null,zero,urandom,random,ttyS0,ptmx,pts,shm,")
    assert got["pts_listing"] == ("ok", ".,..,ptmx,")
    assert got["proc_self_listing"][0] == "ok"
    assert sorted(got["proc_self_listing"][1].split(",")) == sorted(
        ".,..,exe,maps,status,stat,statm,smaps_rollup,cgroup,cmdline,mounts,mountinfo,cwd,fd,fdinfo,".split(","))
    assert got["overlay_symlink_loop"] == ("err", "ELOOP")
    assert got["openat2_how_in_low_region"] == ("err", "EFAULT")
    assert got["open_path_in_low_region"] == ("err", "EFAULT")
    assert got["getdents_past_the_end"] == ("err", "EFAULT")


def test_the_view_cannot_be_changed(host):
    root, view, _ = host
    before = {p.name: (p.lstat().st_mtime_ns, p.lstat().st_mode) for p in view.iterdir()}
    r = battery.run("escape_files", "write", str(view), view=[str(view)])
    battery.completed(r, "write")
    got = battery.attempts(r)
    allowed = {"fcntl_setfl_rdwr", "mmap_private", "msync_private", "munmap_private", "readback"}
    for name, (outcome, detail) in got.items():
        if name not in allowed:
            assert outcome == "err", (name, detail)
    assert got["open_rdwr"] == ("err", "EROFS") and got["rename_out"] == ("err", "EROFS")
    assert got["write_after_setfl"] == ("err", "EBADF")  # F_SETFL cannot change the access mode
    assert got["mmap_shared_write"] == ("err", "EACCES")
    assert got["readback"] == ("ok", "visible\\x20data")  # the private mapping's write stayed private
    assert {p.name: (p.lstat().st_mtime_ns, p.lstat().st_mode) for p in view.iterdir()} == before
    assert (view / "data.txt").read_text() == "visible data"


def _project(parent: str):
    root = Path(tempfile.mkdtemp(prefix="zb-escape-", dir=parent))
    proj, outside = root / "notebook", root / "outside"
    proj.mkdir()
    outside.mkdir()
    (proj / "inside.txt").write_text("inside")
    token = "TOKEN-" + secrets.token_hex(12)
    (outside / "secret.txt").write_text(token)
    os.symlink(str(outside), proj / "link_out")
    os.symlink("/etc", proj / "link_etc")
    os.symlink(str(outside / "secret.txt"), proj / "link_file")
    return root, proj, outside, token


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = os.readlink(p) if p.is_symlink() else (p.read_text() if p.is_file() else "dir")
    return out


@pytest.mark.parametrize("parent", ["/tmp", "/var/tmp"])
@pytest.mark.parametrize("mode", ["readonly", "overlay", "readwrite"])
def test_the_notebook_folder_cannot_be_left(mode, parent):
    if not os.path.isdir(parent):
        pytest.skip(f"no {parent} on this host")
    root, proj, outside, token = _project(parent)
    try:
        outside_before, proj_before = _tree(outside), _tree(proj)
        with battery.boot("escape_files", "project", str(proj), str(outside), mode) as sb:
            sb.mount_project(str(proj), mode)
            r = battery.guest_c.drive(sb)
        battery.completed(r, "project")
        got = battery.attempts(r)
        assert token not in r.out and token not in r.err
        assert got["read_inside"] == ("ok", "inside")
        for name, (outcome, detail) in got.items():
            if name.startswith(("read_", "create_", "write_", "unlink_", "rename_", "openat", "link_", "mkdir_via")) \
                    and name != "read_inside":
                assert outcome == "err", (mode, name, detail)
        # nothing outside the folder changed, in any mode
        assert _tree(outside) == outside_before
        assert sorted(os.listdir(root)) == ["notebook", "outside"]
        after = _tree(proj)
        if mode in ("readonly", "overlay"):
            assert after == proj_before  # the host's folder is never changed
        else:
            # read-write: the guest's own entries appear in the folder, and only there; its
            # symlinks are stored as symlinks (host calls never follow them)
            new = {k: v for k, v in after.items() if k not in proj_before}
            assert set(new) == {"guest_link_out", "guest_link_file", "guest_up", "dangling", "sub"}, new
            assert all(os.path.islink(proj / k) for k in new if k != "sub")
            assert {k: v for k, v in after.items() if k in proj_before} == proj_before
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_uart_abuse_that_the_channel_tolerates():
    r = battery.run("escape_files", "uart")
    battery.completed(r, "uart")
    got = battery.attempts(r)
    for name in ("ioctl_tcgets", "ioctl_tiocsti", "ioctl_garbage"):
        assert got[name] == ("err", "ENOTTY")
    assert got["mmap"] == ("err", "ENODEV") and got["pread"] == ("err", "ESPIPE")
    assert got["write_bad_pointer"] == ("err", "EFAULT") and got["write_past_the_end"] == ("err", "EFAULT")
    # one frame written in three pieces through two fds is one frame
    frames = [(e.frame_type, e.data) for e in r.events if e.kind is EventKind.FRAME]
    assert frames == [(101, b"{}")]


@pytest.mark.parametrize("how", ["magic", "version", "huge"])
def test_a_malformed_frame_ends_only_that_vm(how):
    r = battery.run("escape_files", "uart_garbage", how)
    assert r.kind is EventKind.ERROR and "malformed UART frame" in r.end.message, r.describe()
    assert "SURVIVED" not in r.out
    battery.engine_still_works()


def test_a_file_shrinking_under_a_mapping_does_not_kill_the_engine(tmp_path):
    """Regression: project files were mapped into guest memory; after the guest truncated one (read-
    write mode), the engine died of SIGBUS copying the mapping for write(). Run in a child process,
    so that a regression fails this test instead of killing the test run."""
    proj = tmp_path / "notebook"
    proj.mkdir()
    here = Path(__file__).resolve().parent
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]
        import battery, guest_c
        with battery.boot("escape_files", "mmap_truncate", {str(proj / "f.bin")!r}) as sb:
            sb.mount_project({str(proj)!r}, "readwrite")
            r = guest_c.drive(sb)
        print("KIND", r.kind.name)
        print(r.out[-3000:])
        guest_c.check("process", "identity")
        print("ENGINE ALIVE")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the engine process died (status {proc.returncode}): {proc.stderr[-2000:]}"
    assert "KIND EXIT" in proc.stdout and "SURVIVED mmap_truncate" in proc.stdout, proc.stdout
    assert "ATTEMPT write_mapping ok" in proc.stdout and "ENGINE ALIVE" in proc.stdout


def test_special_files_in_the_folder_are_not_opened(tmp_path):
    """Regression: a FIFO in the notebook's folder blocked the engine in open() (no deadline or
    interrupt reaches a blocked host call), and device nodes were opened like files."""
    proj = tmp_path / "notebook"
    proj.mkdir()
    os.mkfifo(proj / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(proj / "sock"))
    paths = [proj / "fifo", proj / "sock"]
    if os.geteuid() == 0:
        os.mknod(proj / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        paths.append(proj / "null")

    def unblock() -> None:  # should the engine block after all, free it so the test can fail
        time.sleep(10)
        try:
            os.close(os.open(proj / "fifo", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    threading.Thread(target=unblock, daemon=True).start()
    try:
        for mode in ("readonly", "overlay", "readwrite"):
            t0 = time.monotonic()
            with battery.boot("escape_files", "open_special", *map(str, paths)) as sb:
                sb.mount_project(str(proj), mode)
                r = battery.guest_c.drive(sb, timeout=5)
            assert time.monotonic() - t0 < 3, f"the engine blocked opening a special file ({mode})"
            battery.completed(r, "open_special")
            got = battery.attempts(r)
            assert len(got) == 2 * len(paths)
            assert all(v == ("err", "EACCES") for v in got.values()), (mode, got)
    finally:
        sock.close()


@pytest.mark.parametrize("mode", ["readonly", "overlay", "readwrite"])
def test_guest_sockets_never_reach_or_make_host_sockets(tmp_path, mode):
    """The guest's AF_UNIX sockets live in the sandbox: connecting to a host socket file in the
    notebook's folder (directly or through a symlink the guest made) or to a host abstract name
    is refused while the host really listens there, and bind never makes a socket file on the
    host (EACCES in a read-write folder; in the overlay it is the sandbox's own)."""
    proj = tmp_path / "notebook"
    proj.mkdir()
    host_sock = proj / "host.sock"
    abstract = f"zb-escape-{os.getpid()}-{mode}"
    listeners = []
    for address in (str(host_sock), "\0" + abstract):
        s = socket.socket(socket.AF_UNIX)
        s.bind(address)
        s.listen(8)
        s.setblocking(False)
        listeners.append(s)
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(proj))
    try:
        with battery.boot("escape_files", "unix_sockets", str(proj), str(host_sock), abstract) as sb:
            sb.mount_project(str(proj), mode)
            r = battery.guest_c.drive(sb)
        battery.completed(r, "unix_sockets")
        got = battery.attempts(r)
        for name in ("connect_host_socket", "connect_host_abstract"):
            assert got[name] == ("err", "ECONNREFUSED"), (mode, got)
        assert got["connect_via_symlink"] == ("err", "ECONNREFUSED"), (mode, got)
        assert got["bind_over_host_socket"] == ("err", "EADDRINUSE"), (mode, got)
        assert got["bind_in_folder"] == (("ok", "") if mode == "overlay" else ("err", "EACCES" if mode == "readwrite" else "EROFS")), (mode, got)
        assert got["bind_beside_folder"][0] == "err", (mode, got)
        for s in listeners:  # no connection ever reached the host's listeners
            with pytest.raises(BlockingIOError):
                s.accept()
        assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(proj))) == before  # nothing made on the host
    finally:
        for s in listeners:
            s.close()


def test_the_sandboxs_loopback_is_not_the_hosts():
    """TCP in the guest is on the sandbox's own loopback: the host's listeners on 127.0.0.1 and ::1
    (a Jupyter server's, a database's) are unreachable while they really listen, their ports are
    free for the guest to bind, and no connection ever reaches them."""
    listeners = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family)
        s.bind((address, 0))
        s.listen(8)
        s.setblocking(False)
        listeners.append(s)
    p4, p6 = (s.getsockname()[1] for s in listeners)
    try:
        with battery.boot("escape_files", "tcp_loopback", str(p4), str(p6)) as sb:
            r = battery.guest_c.drive(sb)
        battery.completed(r, "tcp_loopback")
        got = battery.attempts(r)
        for name in ("connect_host_v4", "connect_host_v4_any", "connect_host_v6", "connect_host_v4_mapped"):
            assert got[name] == ("err", "ECONNREFUSED"), got
        assert got["bind_host_port_v4"] == ("ok", "") and got["bind_host_port_v6"] == ("ok", ""), got
        assert got["bind_host_address"] == ("err", "EADDRNOTAVAIL"), got
        for s in listeners:  # no connection ever reached the host's listeners
            with pytest.raises(BlockingIOError):
                s.accept()
    finally:
        for s in listeners:
            s.close()


@pytest.mark.parametrize("mode", ["readonly", "overlay", "readwrite"])
def test_copy_calls_obey_the_folder_mode(tmp_path, mode):
    """sendfile/copy_file_range write through the output file's own write: the folder's mode holds
    exactly as for write(2); hostile offsets and counts; FIFOs and devices are never made there."""
    proj = tmp_path / "notebook"
    proj.mkdir()
    (proj / "inside.txt").write_text("inside")
    with battery.boot("escape_files", "copy_calls", str(proj)) as sb:
        sb.mount_project(str(proj), mode)
        r = battery.guest_c.drive(sb)
    battery.completed(r, "copy_calls")
    got = battery.attempts(r)
    assert got["sendfile_into_readonly_fd"] == ("err", "EBADF"), got
    assert got["copy_range_into_readonly_fd"] == ("err", "EBADF"), got
    if mode == "readonly":
        assert got["open_for_writing"] == ("err", "EROFS"), got
    else:
        assert got["open_for_writing"][0] == "ok", got
        assert got["sendfile_into_folder_file"] == ("ok", ""), got
        # the upper copy is the sandbox's own file system; a host file is another (EXDEV)
        assert got["copy_range_into_folder_file"] == (("ok", "") if mode == "overlay" else ("err", "EXDEV")), got
        assert got["guest_view_after"] == ("ok", "PLANTED"), got
    for name in ("sendfile_offset_null_page", "sendfile_offset_low_region", "sendfile_offset_kernel",
                 "copy_range_in_offset_bad", "copy_range_out_offset_bad"):
        assert got[name] == ("err", "EFAULT"), (name, got)
    assert got["copy_range_same_overlap"] == ("err", "EINVAL"), got
    assert got["sendfile_huge_count"] == ("ok", "7"), got
    assert got["copy_range_huge"] == ("ok", str(16 << 20)), got  # one call copies at most 16 MiB
    # a FIFO is made only in the sandbox's own files: an overlay folder's upper layer, never the host
    assert got["mkfifo_in_folder"] == {"readonly": ("err", "EROFS"), "overlay": ("ok", ""),
                                       "readwrite": ("err", "EPERM")}[mode], got
    assert got["mknod_device_in_folder"] == ("err", "EPERM"), got
    # the host's folder: changed only by a read-write folder's write, as write(2) would
    assert sorted(os.listdir(proj)) == ["inside.txt"]
    assert (proj / "inside.txt").read_text() == ("PLANTED" if mode == "readwrite" else "inside")
