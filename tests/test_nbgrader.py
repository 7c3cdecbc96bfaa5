"""Autograding with nbgrader in zeroboot sandboxes (issue 18 item 3; docs/GRADING.md).

A small course (tests/grading_course.py: one assignment, two autograded answers with their test
cells) is released with `nbgrader generate_assignment`, 20 students' submissions are generated (12
honest ones with known grades, 8 hostile ones), and `nbgrader autograde` grades them all with the
course's nbgrader_config.py calling zeroboot_kernel.grading.configure_nbgrader: every submission
runs in a `zeroboot` kernel, i.e. its own VM. The honest ones must get exactly their grades, the
hostile ones (an infinite loop, a segfault, tampering with assert/builtins/the traceback display,
the right answer defined after the tests and the tests edited, writing grades.csv and the
gradebook and deleting another submission, reading another submission, exhausting memory, forged
agent frames) no point, and nothing outside the sandboxes may change: the submissions, source and
release folders are byte for byte what they were, no grades.csv exists, the autograded folders hold
only what nbgrader put there.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import grading_course as course_kit
import nbformat
import pytest

from zeroboot_kernel import grading
from zeroboot_kernel.errors import ZerobootError


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _outputs(nb_path: Path, grade_id: str) -> str:
    """The text of a cell's outputs (streams, error names and values), for the reasons below."""
    nb = nbformat.read(str(nb_path), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return "\n".join(o.get("text", "") or f"{o.get('ename', '')}: {o.get('evalue', '')}" for o in cell.outputs)


@pytest.mark.without_kvm
def test_grading_settings() -> None:
    from traitlets.config import Config

    c = Config()
    env: dict[str, str] = {"ZEROBOOT_PROJECT_ROOT": "/somewhere", "OTHER": "kept"}
    grading.configure_nbgrader(c, timeout=7, memory="1G", environ=env)
    assert c.Execute.kernel_name == "zeroboot" and c.Execute.timeout == 7 and c.Execute.interrupt_on_timeout
    assert c.Execute.iopub_timeout >= 30
    assert env["ZEROBOOT_PROJECT_ROOT"] == "notebook" and env["ZEROBOOT_FILES"] == "overlay"
    assert env["ZEROBOOT_ENV"] == "clean" and env["ZEROBOOT_OUTPUTS"] == "safe" and env["ZEROBOOT_NETWORK"] == "none"
    assert env["ZEROBOOT_MODE"] == "chained" and env["ZEROBOOT_MEMORY"] == "1G" and env["OTHER"] == "kept"
    assert int(env["ZEROBOOT_CELL_TIMEOUT"]) > 7  # nbgrader's interrupt comes first
    with pytest.raises(ZerobootError, match="infinite loop"):
        grading.grading_environment(0)
    with pytest.raises(ZerobootError, match="ZEROBOOT_MEMORY"):
        grading.grading_environment(5, memory="12 bananas")


@pytest.mark.kvm
def test_nbgrader_autograde_in_sandboxes(tmp_path: Path) -> None:
    pytest.importorskip("nbgrader")
    course = tmp_path / "course"
    # the grading template (its own memory size) exists before the clock of the first cell starts,
    # as after `ZEROBOOT_MEMORY=1G zeroboot-kernel template build` on a grading machine; in a cache
    # of the test's own (another process's `template rm` or rebuild must not land in the middle)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), **course_kit.install_kernelspecs(tmp_path / "prefix")}
    subprocess.run([sys.executable, "-c", "from zeroboot_kernel.template import Template; Template.ensure()"],
                   check=True, timeout=600, env={**os.environ, **env, "ZEROBOOT_MEMORY": course_kit.MEMORY})
    course_kit.write_course(course)
    subs = course_kit.submissions(course)
    assert len(subs) == 20 and sum(s.hostile for s in subs) == 8
    course_kit.write_submissions(course, subs)
    before = {name: _tree_digest(course / name) for name in ("submitted", "source", "release")}

    course_kit.nbgrader(course, "autograde", course_kit.ASSIGNMENT, "--force", env=env)

    got = course_kit.grades(course, [s.student for s in subs])
    wrong = {s.student: (got[s.student], s.expected) for s in subs if got[s.student] != s.expected}
    assert not wrong, f"grades (got, expected): {wrong}"
    assert all(sum(got[s.student].values()) == 0 for s in subs if s.hostile)

    # nothing outside the sandboxes changed
    assert {name: _tree_digest(course / name) for name in before} == before
    assert not list(tmp_path.rglob("grades.csv"))
    for sub in subs:
        folder = course / "autograded" / sub.student / course_kit.ASSIGNMENT
        assert sorted(p.name for p in folder.iterdir()) == [f"{course_kit.NOTEBOOK}.ipynb", "timestamp.txt"], sub

    # and for the reasons the sandbox gives, not by luck
    graded = {s.student: course / "autograded" / s.student / course_kit.ASSIGNMENT / f"{course_kit.NOTEBOOK}.ipynb"
              for s in subs}
    assert "Read-only file system" in _outputs(graded["h_grades"], "squares")     # the gradebook, ../grades.csv
    assert "No such file or directory" in _outputs(graded["h_grades"], "total")   # s02's folder is not there
    assert "No such file or directory" in _outputs(graded["h_read"], "squares")   # nor s01's submission
    assert "['ps1']" in _outputs(graded["h_read"], "total")                       # '..' is the submission's folder
    assert "SIGSEGV" in _outputs(graded["h_segv"], "test_squares")
    assert "SIGSEGV" in _outputs(graded["h_segv"], "test_total")
    # the forged frames end the cell with an error (the engine refuses the malformed frame, or the
    # cell waits for a reply until nbgrader's timeout, depending on where the agent was), never ok
    assert "Error" in _outputs(graded["h_frames"], "squares")
    assert "AssertionError" in _outputs(graded["h_tamper"], "test_squares")       # shown though showtraceback is gone
