"""A small nbgrader course for tests/test_nbgrader.py: one assignment (ps1/problem1.ipynb) with two
autograded answers and their test cells, and 20 generated student submissions, 8 of them hostile.

Each submission says what it writes into the two answer cells, what it appends after the last
cell, and the points it must get (squares: 2, total: 1). The hostile ones attack the grader
(docs/GRADING.md): none of them may score a point or change anything outside its sandbox.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import v4

ASSIGNMENT = "ps1"
NOTEBOOK = "problem1"
TIMEOUT = 8  # nbgrader's cell timeout, seconds: the infinite loops wait this long; an honest cell takes < 1 s
MEMORY = "1G"  # each submission's guest memory: what h_mem exhausts
POINTS = {"test_squares": 2.0, "test_total": 1.0}

SQUARES_OK = "def squares(n):\n    return [i * i for i in range(1, n + 1)]"
TOTAL_OK = "def total(xs):\n    return sum(xs)"
STUB = "# YOUR CODE HERE\nraise NotImplementedError()"


def _nbgrader(cell: nbformat.NotebookNode, grade_id: str, *, solution: bool, grade: bool,
              points: float | None = None) -> nbformat.NotebookNode:
    meta = {"grade": grade, "solution": solution, "locked": not solution, "schema_version": 3, "grade_id": grade_id}
    if points is not None:
        meta["points"] = points
    cell.metadata["nbgrader"] = meta
    return cell


def source_notebook() -> nbformat.NotebookNode:
    """The instructor's version (nbgrader's source/ folder), solutions marked for generate_assignment."""
    cells = [
        v4.new_markdown_cell("# Problem 1\nWrite `squares(n)`, the squares of 1..n, and `total(xs)`, their sum."),
        _nbgrader(v4.new_code_cell("def squares(n):\n    ### BEGIN SOLUTION\n    return [i * i for i in range(1, n + 1)]\n"
                                   "    ### END SOLUTION"), "squares", solution=True, grade=False),
        _nbgrader(v4.new_code_cell("assert squares(1) == [1]\nassert squares(3) == [1, 4, 9]\n"
                                   "assert squares(0) == []"), "test_squares", solution=False, grade=True,
                  points=POINTS["test_squares"]),
        _nbgrader(v4.new_code_cell("def total(xs):\n    ### BEGIN SOLUTION\n    return sum(xs)\n    ### END SOLUTION"),
                  "total", solution=True, grade=False),
        _nbgrader(v4.new_code_cell("assert total([1, 2, 3]) == 6\nassert total([]) == 0\n"
                                   "assert total(squares(4)) == 30"), "test_total", solution=False, grade=True,
                  points=POINTS["test_total"]),
    ]
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "zeroboot", "display_name": "Python 3 (zeroboot VM)", "language": "python"}
    return nb


@dataclass(frozen=True)
class Submission:
    student: str
    squares: str                 # the first answer cell's code
    total: str                   # the second's
    expected: dict[str, float]   # grade_id -> points it must get
    appended: list[str] = field(default_factory=list)   # cells the student added at the end
    tests_replaced: str | None = None                   # what the student wrote over the test cells
    hostile: bool = False


def _zero() -> dict[str, float]:
    return {"test_squares": 0.0, "test_total": 0.0}


def _full() -> dict[str, float]:
    return dict(POINTS)


def submissions(course: Path) -> list[Submission]:
    """12 honest submissions with grades from 0 to full, 8 hostile ones (all must get 0)."""
    other = course / "submitted" / "s01" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    gradebook = course / "gradebook.db"
    honest = [
        Submission("s01", SQUARES_OK, TOTAL_OK, _full()),
        Submission("s02", "def squares(n):\n    out = []\n    for i in range(n):\n        out.append((i + 1) ** 2)\n"
                          "    return out", "def total(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t",
                   _full()),
        Submission("s03", "import numpy as np\n\ndef squares(n):\n    return [int(v) for v in np.arange(1, n + 1) ** 2]",
                   "import numpy as np\n\ndef total(xs):\n    return int(np.sum(np.asarray(xs, dtype=np.int64)))",
                   _full()),
        Submission("s04", "squares = lambda n: [k * k for k in range(1, n + 1)]\nprint('my squares', squares(5))",
                   "from functools import reduce\n\ndef total(xs):\n    return reduce(lambda a, b: a + b, xs, 0)",
                   _full()),
        Submission("s05", SQUARES_OK, "def total(xs):\n    return sum(xs) + 1",
                   {"test_squares": 2.0, "test_total": 0.0}),
        Submission("s06", "def squares(n):\n    return [i * i for i in range(n)]", TOTAL_OK,
                   {"test_squares": 0.0, "test_total": 0.0}),  # total(squares(4)) uses the wrong squares
        Submission("s07", STUB, STUB, _zero()),
        Submission("s08", "def squares(n)\n    return n", TOTAL_OK, {"test_squares": 0.0, "test_total": 0.0}),
        Submission("s09", "def squares(n):\n    return list(map(lambda i: i ** 2, range(1, n + 1)))", STUB,
                   {"test_squares": 2.0, "test_total": 0.0}),
        Submission("s10", "def squares(n):\n    if n == 3:\n        return [1, 4, 9]\n    return [1]", TOTAL_OK,
                   {"test_squares": 0.0, "test_total": 0.0}),
        # a scratch file in the submission's folder: written and read back inside the sandbox
        Submission("s11", "with open('scratch.txt', 'w') as f:\n    f.write('1 4 9 16 25 36 49 64 81 100')\n\n"
                          "def squares(n):\n    with open('scratch.txt') as f:\n"
                          "        return [int(v) for v in f.read().split()][:n]", TOTAL_OK, _full()),
        Submission("s12", "import math\n\ndef squares(n):\n    return [math.isqrt(i * i) ** 2 for i in range(1, n + 1)]",
                   "def total(xs):\n    return math.fsum(xs)", _full()),
    ]
    wrong_squares = "def squares(n):\n    return [0] * n"
    wrong_total = "def total(xs):\n    return -1"
    hostile = [
        # an infinite loop in each function: nbgrader's timeout interrupts both test cells
        Submission("h_loop", "def squares(n):\n    while True:\n        pass",
                   "def total(xs):\n    while True:\n        try:\n            pass\n        except KeyboardInterrupt:\n"
                   "            pass", _zero(), hostile=True),
        # a segfault when the tests call the function: the cell's VM dies, the session rolls back
        Submission("h_segv", "import ctypes\n\ndef squares(n):\n    return ctypes.string_at(0)",
                   "import ctypes\n\ndef total(xs):\n    ctypes.memset(0, 0, 4096)\n    return sum(xs)", _zero(),
                   hostile=True),
        # the grading cells' globals: assert's exception, builtins, the traceback display, the hooks
        Submission("h_tamper", "import builtins, sys\nclass Quiet(Exception):\n    pass\n"
                               "builtins.AssertionError = Quiet\nAssertionError = Quiet\n"
                               "sys.excepthook = lambda *a: None\n"
                               "get_ipython().showtraceback = lambda *a, **k: None\n"
                               "get_ipython().showsyntaxerror = lambda *a, **k: None\n" + wrong_squares,
                   wrong_total, _zero(), hostile=True),
        # wrong answers, the right ones defined only after the tests ran; the tests edited to `pass`
        Submission("h_redefine", wrong_squares, wrong_total, _zero(), appended=[SQUARES_OK, TOTAL_OK],
                   tests_replaced="pass", hostile=True),
        # the gradebook and grades.csv: through the folder above, by absolute path, and in the sandbox
        Submission("h_grades", "import os\nfor p in ['grades.csv', '../grades.csv', '../../grades.csv', "
                               f"'../../../grades.csv', {str(course / 'grades.csv')!r}]:\n"
                               "    try:\n        open(p, 'w').write('student_id,score\\nh_grades,100\\n')\n"
                               "    except OSError as e:\n        print(p, e)\n"
                               f"try:\n    open({str(gradebook)!r}, 'wb').write(b'gone')\n"
                               "except OSError as e:\n    print('gradebook', e)\n" + wrong_squares,
                   "import os, shutil\ntry:\n"
                   f"    shutil.rmtree({str(course / 'submitted' / 's02')!r})\n"
                   "except OSError as e:\n    print('rmtree', e)\n" + wrong_total, _zero(), hostile=True),
        # another student's submission: read by absolute path and through the folders above
        Submission("h_read", "import json, os\nsrc = None\n"
                             f"for p in [{str(other)!r}, '../../../submitted/s01/ps1/problem1.ipynb', "
                             "'../../s01/ps1/problem1.ipynb']:\n"
                             "    try:\n        src = json.load(open(p))\n        break\n"
                             "    except OSError as e:\n        print(p, e)\n"
                             "if src is not None:\n"
                             "    exec('\\n'.join(''.join(c['source']) for c in src['cells'] if c['cell_type'] == 'code' "
                             "and 'assert' not in ''.join(c['source'])))",
                   "print(os.listdir('.'), os.listdir('..'))", _zero(), hostile=True),
        # all of the guest's memory: a MemoryError (or the VM's end) in the test cells
        Submission("h_mem", "def squares(n):\n    hog = []\n    while True:\n        hog.append(bytearray(64 << 20))",
                   "def total(xs):\n    return bytearray(1 << 44)", _zero(), hostile=True),
        # the frames the agent sends, written by the student: a forged 'ok' cannot pass a test
        Submission("h_frames", "import os\ntry:\n    fd = os.open('/dev/ttyS0', os.O_WRONLY)\n"
                               "    os.write(fd, b'\\x00' * 64 + b'{\"status\": \"ok\"}' * 8)\n"
                               "except OSError as e:\n    print('tty', e)\n" + wrong_squares,
                   wrong_total, _zero(), hostile=True),
    ]
    return honest + hostile


def write_course(course: Path) -> None:
    """The course folder with its config, a .git marker (a project root the sandbox must not show),
    the source notebook, and the release made by `nbgrader generate_assignment`."""
    course.mkdir(parents=True, exist_ok=True)
    (course / ".git").mkdir(exist_ok=True)
    (course / "nbgrader_config.py").write_text(
        "from zeroboot_kernel.grading import configure_nbgrader\n"
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"configure_nbgrader(c, timeout={TIMEOUT}, memory={MEMORY!r})\n")
    source = course / "source" / ASSIGNMENT
    source.mkdir(parents=True, exist_ok=True)
    nbformat.write(source_notebook(), str(source / f"{NOTEBOOK}.ipynb"))
    nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")


def write_submissions(course: Path, subs: list[Submission]) -> None:
    """Each student's copy of the released notebook, answered as the Submission says."""
    release = nbformat.read(str(course / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"), as_version=4)
    for sub in subs:
        nb = nbformat.from_dict(json.loads(json.dumps(release)))
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id == "squares":
                cell.source = sub.squares
            elif grade_id == "total":
                cell.source = sub.total
            elif grade_id in POINTS and sub.tests_replaced is not None:
                cell.source = sub.tests_replaced
        nb.cells.extend(v4.new_code_cell(code) for code in sub.appended)
        folder = course / "submitted" / sub.student / ASSIGNMENT
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(folder / f"{NOTEBOOK}.ipynb"))
        (folder / "timestamp.txt").write_text("2026-12-01 12:00:00.000000 UTC")


def install_kernelspecs(prefix: Path) -> dict[str, str]:
    """This checkout's kernelspecs under `prefix` (no template: the caller builds the one it
    needs); the environment that makes Jupyter find them."""
    subprocess.run([sys.executable, "-m", "zeroboot_kernel", "install", "--prefix", str(prefix), "--no-template"],
                   check=True, capture_output=True, timeout=300)
    paths = [str(prefix / "share" / "jupyter"), *filter(None, os.environ.get("JUPYTER_PATH", "").split(os.pathsep))]
    return {"JUPYTER_PATH": os.pathsep.join(paths)}


def nbgrader(course: Path, *args: str, env: dict[str, str] | None = None,
             timeout: float = 900) -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(sys.executable).parent)  # nbgrader runs `alembic` from PATH
    proc = subprocess.run([os.path.join(bin_dir, "nbgrader"), *args], cwd=course, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1",
                                                "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")})
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-6000:]}")
    return proc


def grades(course: Path, students: list[str]) -> dict[str, dict[str, float]]:
    """Points per student and test cell, from the gradebook nbgrader autograde filled in."""
    from nbgrader.api import Gradebook

    out: dict[str, dict[str, float]] = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student in students:
            out[student] = {gid: float(gb.find_grade(gid, NOTEBOOK, ASSIGNMENT, student).score) for gid in POINTS}
    return out
