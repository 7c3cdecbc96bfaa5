"""Issue 11 item 3: `%sandbox files MODE` is a property of the session. It holds for every state
restored afterwards (isolated cells start from `clean`, %rewind restores a checkpoint taken
before the switch) and for files opened before it (a readwrite file object kept in a variable
must not reach the host once the folder is read-only). Each of these failed before the fix."""
from __future__ import annotations

import pytest

from zeroboot_kernel.session import Session

from session_helpers import cell


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "notebook"
    root.mkdir()
    (root / "data.txt").write_text("original\n")
    return root


def test_a_file_opened_readwrite_stops_writing_once_the_folder_is_readonly(template, project):
    s = Session(template, project_dir=str(project), files="readwrite")
    try:
        assert cell(s, "f = open('data.txt', 'a')\ng = open('data.txt', 'r+')", 1)["status"] == "ok"
        s.set_files("readonly")
        r = cell(s, "f.write('appended after the switch\\n')\nf.flush()", 2)
        assert r["status"] == "error" and "Read-only file system" in r["evalue"], r
        r = cell(s, "import os\ng.truncate(0)", 3)
        assert r["status"] == "error" and "Read-only file system" in r["evalue"], r
        s.set_files("overlay")  # stricter than readwrite too: the host must not change
        r = cell(s, "f2 = open('data.txt', 'a')\nf2.write('private\\n'); f2.flush()\n"
                    "os.write(f.fileno(), b'through the old fd\\n')", 4)
        assert r["status"] == "error" and "Read-only file system" in r["evalue"], r
    finally:
        s.close()
    assert (project / "data.txt").read_text() == "original\n"


def test_isolated_cells_restore_the_current_mode(template, project):
    s = Session(template, mode="isolated", project_dir=str(project))
    try:
        assert cell(s, "open('scratch.txt', 'w').write('x')", 1)["status"] == "ok"  # overlay: allowed
        s.set_files("readonly")
        for n in (2, 3):  # every later cell, each restored from the session's clean state
            r = cell(s, "open('scratch.txt', 'w').write('x')", n)
            assert r["status"] == "error" and "Read-only file system" in r["evalue"], r
        assert s.stats()["files"]["mode"] == "readonly"
    finally:
        s.close()


def test_rewind_after_a_switch_keeps_the_new_mode(template, project):
    s = Session(template, project_dir=str(project))
    try:
        cell(s, "x = 1", 1)
        cell(s, "y = 2", 2)
        s.set_files("readonly")
        s.rewind(1)
        r = cell(s, "open('after-rewind.txt', 'w').write('x')", 3)
        assert r["status"] == "error" and "Read-only file system" in r["evalue"], r
        s.set_files("overlay")
        assert cell(s, "open('after-rewind.txt', 'w').write('x')", 4)["status"] == "ok"
    finally:
        s.close()
    assert not (project / "after-rewind.txt").exists()
