"""The notebook's own files inside the sandbox (issue 7), at the session level: the notebook's
folder is the cells' working directory; reads pass through, writes stay private (overlay), fail
(readonly) or go to the host (readwrite, confined to the folder); export, diff and rewind."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from zeroboot_kernel.errors import SandboxError
from zeroboot_kernel.session import Session

from session_helpers import cell


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "notebook"
    (root / "data").mkdir(parents=True)
    (root / "data" / "sales.csv").write_text("region,amount\nnorth,10\nsouth,32\n")
    np.save(root / "weights.npy", np.arange(6.0))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret\n")
    os.symlink("/etc", root / "etc-link")
    os.symlink(str(outside), root / "parent-link")
    return root


def snapshot_of(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_overlay_reads_beside_the_notebook_and_keeps_writes_private(template, project) -> None:
    before = snapshot_of(project)
    s = Session(template, project_dir=str(project))
    try:
        assert cell(s, "import os\nos.getcwd()")["result"] == repr(str(project))
        r = cell(s, "import pandas as pd, numpy as np\nint(pd.read_csv('data/sales.csv').amount.sum()), "
                    "float(np.load('weights.npy').sum())")
        assert r["result"] == "(42, 15.0)"
        cell(s, "pd.DataFrame({'x': [1, 2]}).to_csv('out.csv', index=False)\n"
                "open('data/sales.csv', 'a').write('east,1\\n')\nos.remove('weights.npy')")
        r = cell(s, "open('out.csv').read(), os.path.exists('weights.npy'), open('data/sales.csv').read().count('\\n')")
        assert r["result"] == "('x\\n1\\n2\\n', False, 4)"
        assert snapshot_of(project) == before, "the host folder changed"
        assert sorted(map(tuple, s.diff())) == [("A", "out.csv"), ("D", "weights.npy"), ("M", "data/sales.csv")]
        assert "exported" in s.export("out.csv")
        assert (project / "out.csv").read_text() == "x\n1\n2\n"
    finally:
        s.close()


@pytest.mark.parametrize("files, writable", [("overlay", True), ("readonly", False), ("readwrite", True)])
def test_access_says_what_a_write_would_do(template, project, files: str, writable: bool) -> None:
    """os.access(W_OK) of the notebook's folder itself (the cwd), a folder and a file in it agrees
    with the files mode, as libraries that check before writing rely on (it said False for the
    folder itself in overlay mode, where writes work); the folder above it is the read-only view."""
    s = Session(template, project_dir=str(project), files=files)
    try:
        r = cell(s, "import os\n[os.access(p, os.W_OK) for p in ('.', 'data', 'data/sales.csv')], "
                    "os.access('..', os.W_OK), os.access('.', os.R_OK | os.X_OK)")
        assert r["result"] == repr(([writable] * 3, False, True)), r
    finally:
        s.close()


def test_the_notebooks_files_are_the_guest_users(template, project) -> None:
    """What the kernel's user owns on the host (the notebook's files) is the guest user's in the
    sandbox, as under ipykernel, where the user owns them: git refuses a repository whose owner is
    not the caller ("dubious ownership"), pip and ssh check owners too. The system view keeps its
    owners (root)."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    s = Session(template, project_dir=str(project))
    try:
        r = cell(s, "import os, subprocess\n"
                    "ids = [(os.stat(p).st_uid, os.stat(p).st_gid) == (os.getuid(), os.getgid()) for p in "
                    "('.', '.git', 'data', 'data/sales.csv')]\n"
                    "fd = os.open('data/sales.csv', os.O_RDONLY); ids.append(os.fstat(fd).st_uid == os.getuid()); os.close(fd)\n"
                    "git = subprocess.run(['git', 'status', '--porcelain'], capture_output=True, text=True)\n"
                    "ids, os.stat('/usr/bin').st_uid, git.returncode, git.stderr")
        assert r["result"] == repr(([True] * 5, 0, 0, "")), r
    finally:
        s.close()


def test_rewind_also_rewinds_the_files(template, project) -> None:
    s = Session(template, project_dir=str(project))
    try:
        cell(s, "open('kept.txt', 'w').write('1')", 1)
        cell(s, "open('undone.txt', 'w').write('2')\nimport os\nos.remove('weights.npy')", 2)
        s.rewind(1)
        r = cell(s, "import os\nos.path.exists('kept.txt'), os.path.exists('undone.txt'), os.path.exists('weights.npy')", 3)
        assert r["result"] == "(True, False, True)"
    finally:
        s.close()


def test_isolated_cells_start_with_the_host_files(template, project) -> None:
    s = Session(template, mode="isolated", project_dir=str(project))
    try:
        cell(s, "open('scratch.txt', 'w').write('x')")
        r = cell(s, "import os\nos.path.exists('scratch.txt'), os.path.exists('data/sales.csv')")
        assert r["result"] == "(False, True)"
    finally:
        s.close()


def test_readonly_refuses_writes(template, project) -> None:
    s = Session(template, project_dir=str(project), files="readonly")
    try:
        r = cell(s, "open('x.txt', 'w')")
        assert r["status"] == "error" and "Read-only file system" in r["evalue"]
        assert cell(s, "len(open('data/sales.csv').read())")["result"] == str(len("region,amount\nnorth,10\nsouth,32\n"))
    finally:
        s.close()


ESCAPES = [
    "open('../outside/secret.txt', 'w')",
    "open({outside!r} + '/secret.txt', 'w')",
    "open('parent-link/secret.txt', 'w')",
    "open('etc-link/evil', 'w')",
    "os.symlink('/etc/passwd', 'planted'); open('planted', 'w')",
    "os.rename('data/sales.csv', '../outside/stolen.csv')",
]


@pytest.mark.parametrize("files", ["overlay", "readwrite"])
@pytest.mark.parametrize("attempt", ESCAPES)
def test_no_write_outside_the_folder(template, project, files: str, attempt: str) -> None:
    outside = project.parent / "outside"
    before = snapshot_of(outside)
    s = Session(template, project_dir=str(project), files=files)
    try:
        r = cell(s, "import os\n" + attempt.format(outside=str(outside)))
        assert r["status"] == "error", r
    finally:
        s.close()
    assert snapshot_of(outside) == before
    assert not (project / "planted").exists() or files == "readwrite"


def test_readwrite_writes_through(template, project) -> None:
    s = Session(template, project_dir=str(project), files="readwrite")
    try:
        cell(s, "open('result.txt', 'w').write('done')\nimport os\nos.mkdir('figs')\nos.rename('result.txt', 'figs/r.txt')")
        assert (project / "figs" / "r.txt").read_text() == "done"
    finally:
        s.close()


def test_switching_files_mode(template, project) -> None:
    s = Session(template, project_dir=str(project))
    try:
        cell(s, "open('private.txt', 'w').write('p')")
        s.set_files("readonly")
        assert cell(s, "open('another.txt', 'w')")["status"] == "error"
        s.set_files("overlay")
        assert cell(s, "open('private.txt').read()")["result"] == "'p'"
        with pytest.raises(SandboxError):
            s.set_files("sideways")
    finally:
        s.close()
    assert not (project / "private.txt").exists()


def test_overlay_size_cap_gives_enospc(template, project) -> None:
    s = Session(template, project_dir=str(project))
    try:
        r = cell(s, "chunk = b'x' * (1 << 20)\ntry:\n    with open('huge.bin', 'wb') as f:\n"
                    "        for _ in range(1024): f.write(chunk)\nexcept OSError as e:\n    print(e.errno)")
        assert r["stdout"].strip() == "28"  # ENOSPC
    finally:
        s.close()
