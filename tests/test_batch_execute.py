"""`zeroboot-kernel execute` and `zeroboot_kernel.execute_notebooks` (issue 18 item 1).

The differential tests run the same notebooks through nbclient with the stock `python3` kernel
(papermill's own parameterize_notebook for the parameterised one) and through the batch executor,
and compare what the written notebooks hold: per cell the execution count, the outputs (type,
stream name and text, MIME bundles and their metadata, execute_result counts, error names,
values and tracebacks) and which metadata keys exist; cell ids and timestamps are ignored.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat import v4

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = pytest.mark.kvm


def _code(source: str, tags: list[str] | None = None) -> nbformat.NotebookNode:
    cell = v4.new_code_cell(source)
    if tags:
        cell.metadata["tags"] = tags
    return cell


def _notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


PLOT = _notebook([
    v4.new_markdown_cell("# A plot"),
    _code("import numpy as np\nimport matplotlib.pyplot as plt\nx = np.linspace(0, 1, 50)"),
    _code("fig, ax = plt.subplots(figsize=(3, 2))\nax.plot(x, x ** 2)\nax.set_title('squares')\nplt.show()"),
    _code("print('mean', round(float((x ** 2).mean()), 4))\nx.shape"),
])

ERROR = _notebook([
    _code("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)"),
    _code("def f(d):\n    return 1 / d\n"),
    _code("f(0)"),
    _code("print('never runs')"),
])

PARAMETERISED = _notebook([
    v4.new_markdown_cell("Parameterised for papermill"),
    _code("rows = 3\nlabel = 'default'\nscale = 1.0", tags=["parameters"]),
    _code("import pandas as pd\nimport numpy as np\ndf = pd.DataFrame({'a': np.arange(rows) * scale, 'b': [label] * rows})\ndf"),
    _code(""),
    _code("from IPython.display import display, HTML, Markdown, clear_output\n"
          "h = display(HTML('<b>first</b>'), display_id=True)\n"
          "display(Markdown('*md*'))\n"
          "h.update(HTML('<i>updated</i>'))"),
    _code("print('about to clear')\nclear_output(wait=True)\nprint('after the clear')"),
    _code("df.describe()"),
    _code("raise ValueError('tagged, allowed')", tags=["raises-exception"]),
    _code("print(label, rows, scale, sep='|')"),
])
PARAMETERS = {"rows": 4, "label": "from-the-cli", "scale": 2.5}


def _write(tmp: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    path = tmp / f"{name}.ipynb"
    nbformat.write(nb, str(path))
    return path


def _reference(path: Path, parameters: dict[str, Any] | None = None) -> nbformat.NotebookNode:
    """What nbclient writes with the stock kernel (papermill's loader and injection for parameters)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(str(path), as_version=4)
    if parameters:
        from papermill.iorw import load_notebook_node
        from papermill.parameterize import parameterize_notebook

        nb = parameterize_notebook(load_notebook_node(str(path)), parameters)
    client = NotebookClient(nb, timeout=300, startup_timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError:
        pass  # nbclient stops at the error; the notebook holds what ran
    return nb


def _output_shape(out: dict[str, Any]) -> dict[str, Any]:
    shape = {k: v for k, v in out.items() if k != "transient"}
    if shape["output_type"] == "error":
        shape["traceback"] = [re.sub(r"In\[\d+\]", "In[N]", ANSI.sub("", line)) for line in shape["traceback"]]
    return shape


def _merged_streams(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive stream outputs of one name as one: how a print is cut into stream messages
    depends on timing (under load stock ipykernel sends one print as two), not on the kernel."""
    merged: list[dict[str, Any]] = []
    for out in outputs:
        if merged and out["output_type"] == "stream" and merged[-1]["output_type"] == "stream" \
                and merged[-1]["name"] == out["name"]:
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + out["text"]}
        else:
            merged.append(out)
    return merged


def _shape(nb: nbformat.NotebookNode) -> list[dict[str, Any]]:
    cells = []
    for cell in nb.cells:
        # papermill's own bookkeeping (metadata.papermill, `tags: []` added to every cell) is not nbclient's
        entry: dict[str, Any] = {"type": cell.cell_type, "source": cell.source,
                                 "metadata": sorted(k for k, v in cell.metadata.items()
                                                    if k != "papermill" and not (k == "tags" and v == []))}
        if cell.cell_type == "code":
            entry["execution_count"] = cell.execution_count
            entry["execution"] = sorted(cell.metadata.get("execution", {}))
            entry["outputs"] = [_output_shape(o) for o in _merged_streams(cell.outputs)]
        cells.append(entry)
    return cells


def _assert_same(reference: nbformat.NotebookNode, ours: nbformat.NotebookNode) -> None:
    nbformat.validate(ours)
    ref, got = _shape(reference), _shape(ours)
    assert len(ref) == len(got)
    for i, (r, g) in enumerate(zip(ref, got)):
        assert r == g, f"cell {i} differs:\nnbclient: {json.dumps(r)[:3000]}\nzeroboot: {json.dumps(g)[:3000]}"
    assert ours.metadata["language_info"] == reference.metadata["language_info"]


def _execute(paths: list[Path], out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zeroboot_kernel", "execute", *map(str, paths), "--output-dir",
                           str(out), *args], capture_output=True, text=True, timeout=900, cwd=REPO)


def test_differential_against_nbclient_with_the_stock_kernel(tmp_path: Path) -> None:
    """A plot, an error that stops the notebook, and a parameterised notebook with displays,
    display ids, clear_output, an allowed error: the written notebooks are those nbclient writes."""
    src = tmp_path / "src"
    src.mkdir()
    plot, error, params = _write(src, "plot", PLOT), _write(src, "error", ERROR), _write(src, "params", PARAMETERISED)
    p_args = [a for name, value in PARAMETERS.items() for a in ("-p", name, str(value))]
    out = tmp_path / "out"
    r = _execute([plot, error], out)
    assert r.returncode == 1, r.stdout + r.stderr  # the error notebook failed
    assert re.search(r"plot\.ipynb\s+ok\s", r.stdout) and re.search(r"error\.ipynb\s+failed\s", r.stdout), r.stdout
    assert "1 ok, 1 failed, 0 timed out" in r.stdout
    r = _execute([params], out, *p_args)
    assert r.returncode == 0, r.stdout + r.stderr
    _assert_same(_reference(plot), nbformat.read(str(out / "plot.ipynb"), as_version=4))
    _assert_same(_reference(error), nbformat.read(str(out / "error.ipynb"), as_version=4))
    ours = nbformat.read(str(out / "params.ipynb"), as_version=4)
    _assert_same(_reference(params, PARAMETERS), ours)
    assert ours.metadata["papermill"]["parameters"] == PARAMETERS
    png = [o for c in nbformat.read(str(out / "plot.ipynb"), as_version=4).cells if c.cell_type == "code"
           for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(png) == 1


def _structure(nb: nbformat.NotebookNode) -> list[Any]:
    """Per code cell: its count and, per output, the type, stream name, MIME types, error name."""
    return [(c.execution_count, [(o.output_type, o.get("name"), sorted(o.get("data", {})), o.get("ename"))
                                 for o in c.outputs]) for c in nb.cells if c.cell_type == "code"]


def test_demo_notebooks_run_as_under_the_zeroboot_kernel(tmp_path: Path) -> None:
    """The demo notebooks, full of %sandbox magics and cells that crash or time out on purpose
    (tagged raises-exception), one of them for the isolated kernelspec: batch execution writes what
    nbclient writes with the zeroboot kernels, and the same text wherever it does not depend on
    timing, memory or fresh random seeds."""
    from nbclient import NotebookClient

    from kernel_helpers import NOTEBOOKS, ensure_kernelspecs
    from zeroboot_kernel import execute_notebooks

    ensure_kernelspecs()
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    results = execute_notebooks(paths, output_dir=tmp_path, jobs=2, keep_notebooks=True)
    for path, result in zip(paths, results):
        assert result.ok and result.notebook is not None, result
        reference = nbformat.read(str(path), as_version=4)
        NotebookClient(reference, timeout=300, startup_timeout=120, kernel_name=reference.metadata.kernelspec.name,
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        assert _structure(result.notebook) == _structure(reference), path.name
        for ours, theirs in zip(result.notebook.cells, reference.cells):
            if ours.cell_type == "code" and not re.search(r"%sandbox (stats|checkpoints)|random", ours.source):
                assert [o.get("text") for o in ours.outputs] == [o.get("text") for o in theirs.outputs], ours.source


def test_timeout_stops_the_notebook(tmp_path: Path) -> None:
    nb = _notebook([_code("x = 1"), _code("import time\nprint('sleeping')\ntime.sleep(600)"), _code("print('later')")])
    path = _write(tmp_path, "slow", nb)
    r = _execute([path], tmp_path / "out", "--timeout", "2")
    assert r.returncode == 1 and "0 ok, 0 failed, 1 timed out" in r.stdout, r.stdout + r.stderr
    done = nbformat.read(str(tmp_path / "out" / "slow.ipynb"), as_version=4)
    assert [c.execution_count for c in done.cells] == [1, 2, None]
    assert done.cells[1].outputs[0] == v4.new_output("stream", name="stdout", text="sleeping\n")
    assert done.cells[1].outputs[-1]["ename"] == "SandboxTimeout"
    assert done.cells[2].outputs == []


def test_exit_ends_the_notebook_as_a_dead_kernel_does(tmp_path: Path) -> None:
    """exit() in a cell ends the kernel under ipykernel, and nbclient stops with a dead kernel:
    the batch run stops there too, and says why; exit(keep_kernel=True) goes on."""
    from zeroboot_kernel import execute_notebooks

    path = _write(tmp_path, "exits", _notebook([_code("exit(keep_kernel=True)"), _code("print('before')"),
                                                _code("exit()"), _code("print('after')")]))
    (r,) = execute_notebooks([path], jobs=1, keep_notebooks=True, write=False)
    assert r.status == "failed" and "called exit()" in str(r.error) and r.notebook is not None, r
    assert [c.execution_count for c in r.notebook.cells] == [1, 2, 3, None]


def test_allow_errors_runs_on(tmp_path: Path) -> None:
    path = _write(tmp_path, "error", ERROR)
    r = _execute([path], tmp_path / "out", "--allow-errors")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 error(s) allowed" in r.stdout
    done = nbformat.read(str(tmp_path / "out" / "error.ipynb"), as_version=4)
    assert [c.execution_count for c in done.cells] == [1, 2, 3, 4]
    assert done.cells[3].outputs == [v4.new_output("stream", name="stdout", text="never runs\n")]


def test_a_crash_costs_its_cell_only_where_errors_are_allowed(tmp_path: Path) -> None:
    """Batch sessions take a checkpoint only before the cells whose error lets the notebook go on
    (allow_errors, or the raises-exception tag): a crash there rolls back that cell and the next
    cells see the state before it; a crash elsewhere ends the notebook, and the next notebook in
    the same engine starts clean."""
    from zeroboot_kernel import execute_notebooks

    crash = "import ctypes\nctypes.string_at(0)"
    tagged = _write(tmp_path, "tagged", _notebook([_code("x = 1"), _code(f"x = 2\n{crash}", tags=["raises-exception"]),
                                                   _code("x += 10\nprint(x)")]))
    allowed = _write(tmp_path, "allowed", _notebook([_code("y = 1"), _code(f"y = 2\n{crash}"), _code("print(y)")]))
    stops = _write(tmp_path, "stops", _notebook([_code("z = 1"), _code(f"z = 2\n{crash}"), _code("print(z)")]))
    after = _write(tmp_path, "after", _notebook([_code("print('x' in globals(), 'z' in globals())")]))
    (r,) = execute_notebooks([tagged], jobs=1, keep_notebooks=True, write=False)
    assert r.ok and r.errors_allowed == 1 and r.notebook is not None, r
    assert r.notebook.cells[2].outputs == [v4.new_output("stream", name="stdout", text="11\n")]
    (r,) = execute_notebooks([allowed], jobs=1, keep_notebooks=True, write=False, allow_errors=True)
    assert r.ok and r.notebook is not None and r.notebook.cells[2].outputs[0]["text"] == "1\n", r
    r, r_after = execute_notebooks([stops, after], jobs=1, keep_notebooks=True, write=False)
    assert r.status == "failed" and "SandboxCrashed" in str(r.error) and r.notebook is not None
    assert r.notebook.cells[2].execution_count is None
    assert r_after.ok and r_after.notebook is not None
    assert r_after.notebook.cells[0].outputs[0]["text"] == "False False\n"


def test_jobs_two_keeps_notebooks_apart(tmp_path: Path) -> None:
    """Six notebooks over two workers: each sees its own parameter value, none sees the globals or
    the /tmp file of a notebook that ran before it in the same engine; the results come back in
    the order given."""
    from zeroboot_kernel import execute_notebooks

    cells = [_code("tag = 'none'", tags=["parameters"]),
             _code("import os\nseen = [os.path.exists('/tmp/mark'), 'leftover' in globals()]\n"
                   "open('/tmp/mark', 'w').write(tag)\nleftover = tag\nprint(tag, seen)")]
    paths = []
    for i in range(6):
        d = tmp_path / f"d{i}"
        d.mkdir()
        paths.append(_write(d, "nb", _notebook(cells)))
    with pytest.raises(Exception, match="would both be written"):
        execute_notebooks(paths, output_dir=tmp_path / "out", jobs=2)
    results = execute_notebooks(paths, jobs=2, parameters={"tag": "p"}, keep_notebooks=True)
    assert [r.source for r in results] == paths
    for r in results:
        assert r.ok and r.output == r.source.with_name("nb.executed.ipynb") and r.output.exists(), r
        assert r.notebook is not None
        assert r.notebook.cells[2].outputs == [v4.new_output("stream", name="stdout", text="p [False, False]\n")]


def test_notebooks_of_one_folder_in_one_engine_see_nothing_of_each_other(tmp_path: Path) -> None:
    """One worker, four notebooks of one folder (the engine resets its session between them instead
    of forking anew): none sees another's globals, /tmp or home files, writes to the notebook's
    folder, imported modules or random state; the host folder is unchanged."""
    from zeroboot_kernel import execute_notebooks

    probe = _code("import os, sys, random\n"
                  "seen = ['leftover' in globals(), os.path.exists('/tmp/mark'), os.path.exists(os.path.expanduser('~/mark')),\n"
                  "        os.path.exists('written.txt'), 'json.tool' in sys.modules]\n"
                  "leftover = 1\nopen('/tmp/mark', 'w').write('x')\nopen(os.path.expanduser('~/mark'), 'w').write('x')\n"
                  "open('written.txt', 'w').write('x')\nimport json.tool\nprint(seen, random.random())")
    paths = [_write(tmp_path, f"nb{i}", _notebook([probe])) for i in range(4)]
    results = execute_notebooks(paths, jobs=1, keep_notebooks=True, write=False)
    texts = []
    for r in results:
        assert r.ok and r.notebook is not None, r
        (out,) = r.notebook.cells[0].outputs
        seen, number = out["text"].rsplit(" ", 1)
        assert seen == "[False, False, False, False, False]", out["text"]
        texts.append(number)
    assert len(set(texts)) == 4  # fresh random seeds each time
    assert not (tmp_path / "written.txt").exists()


def test_isolated_cells_start_clean(tmp_path: Path) -> None:
    from zeroboot_kernel import execute_notebooks

    path = _write(tmp_path, "iso", _notebook([_code("a = 1"), _code("print('a' in globals())")]))
    (r,) = execute_notebooks([path], isolated=True, keep_notebooks=True, write=False)
    assert r.ok and r.output is None and not path.with_name("iso.executed.ipynb").exists()
    assert r.notebook is not None
    assert r.notebook.cells[1].outputs == [v4.new_output("stream", name="stdout", text="False\n")]


def test_hostile_notebooks_fail_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell that crashes the guest, one that floods its output past the bound, `%sandbox export`
    (which would write host files), a notebook that is not JSON: each fails (or is cut) on its own,
    the others run."""
    from zeroboot_kernel import execute_notebooks, notebook_runner

    monkeypatch.setattr(notebook_runner, "MAX_OUTPUT_CHARS", 1 << 20)
    crash = _write(tmp_path, "crash", _notebook([_code("import ctypes\nctypes.string_at(0)"), _code("print(1)")]))
    flood = _write(tmp_path, "flood", _notebook([_code("for i in range(40):\n    print('x' * 100_000)"),
                                                 _code("print('still here')")]))
    magic = _write(tmp_path, "magic", _notebook([_code("%sandbox mode isolated\nb = 1"), _code("%sandbox export b.txt")]))
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{not json")
    fine = _write(tmp_path, "fine", _notebook([_code("print(6 * 7)")]))
    results = execute_notebooks([crash, flood, magic, broken, fine], output_dir=tmp_path / "out", jobs=2,
                                keep_notebooks=True)
    by_name = {r.source.name: r for r in results}
    assert by_name["crash.ipynb"].status == "failed" and "SandboxCrashed" in str(by_name["crash.ipynb"].error)
    assert by_name["magic.ipynb"].status == "failed" and "UsageError: %sandbox export writes host files" in str(
        by_name["magic.ipynb"].error)
    assert not (tmp_path / "b.txt").exists()
    assert by_name["broken.ipynb"].status == "failed" and "cannot read" in str(by_name["broken.ipynb"].error)
    assert by_name["fine.ipynb"].ok
    flooded = by_name["flood.ipynb"]
    assert flooded.ok and flooded.notebook is not None and "were dropped" in str(flooded.error)
    text = "".join(o.get("text", "") for o in flooded.notebook.cells[0].outputs)
    assert len(text) < (1 << 20) + 200_000 and "the rest are not written" in text


def test_cli_parameter_named_run_is_not_the_run_command(tmp_path: Path) -> None:
    path = _write(tmp_path, "p", _notebook([_code("run = 0", tags=["parameters"]), _code("print(run + 1)")]))
    r = _execute([path], tmp_path / "out", "-p", "run", "41")
    assert r.returncode == 0, r.stdout + r.stderr
    done = nbformat.read(str(tmp_path / "out" / "p.ipynb"), as_version=4)
    assert done.cells[2].outputs == [v4.new_output("stream", name="stdout", text="42\n")]


def _papermill(path: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("papermill")), str(path), str(out), "--no-progress-bar",
                           *args], capture_output=True, text=True, timeout=900, cwd=path.parent)


def test_papermill_engine_writes_what_papermill_writes(tmp_path: Path) -> None:
    """`papermill --engine zeroboot` against papermill's own nbclient engine with the stock kernel:
    the same notebook, cells, outputs and papermill metadata; an error stops both, which exit 1
    with the error marked in the same cell."""
    # papermill fails a notebook on any error output, raises-exception tag or not: without that cell
    params = _write(tmp_path, "params", _notebook([c for c in PARAMETERISED.cells
                                                   if "raises-exception" not in c.metadata.get("tags", [])]))
    p_args = [a for name, value in PARAMETERS.items() for a in ("-p", name, str(value))]
    ours, theirs = tmp_path / "ours.ipynb", tmp_path / "theirs.ipynb"
    r = _papermill(params, ours, "--engine", "zeroboot", *p_args)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _papermill(params, theirs, "-k", "python3", *p_args)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = nbformat.read(str(ours), as_version=4), nbformat.read(str(theirs), as_version=4)
    _assert_same(b, a)
    assert [sorted(c.metadata.get("papermill", {})) for c in a.cells] == \
        [sorted(c.metadata.get("papermill", {})) for c in b.cells]
    assert [c.metadata["papermill"]["status"] for c in a.cells] == [c.metadata["papermill"]["status"] for c in b.cells]
    assert a.metadata.papermill.parameters == b.metadata.papermill.parameters == PARAMETERS

    error = _write(tmp_path, "error", ERROR)
    r = _papermill(error, ours, "--engine", "zeroboot")
    assert r.returncode == 1 and "ZeroDivisionError" in r.stderr, r.stderr[-3000:]
    r = _papermill(error, theirs, "-k", "python3")
    assert r.returncode == 1, r.stderr[-3000:]
    a, b = nbformat.read(str(ours), as_version=4), nbformat.read(str(theirs), as_version=4)
    assert [c.metadata.get("papermill", {}).get("exception") for c in a.cells] == \
        [c.metadata.get("papermill", {}).get("exception") for c in b.cells]
    assert [(c.cell_type, c.get("execution_count")) for c in a.cells] == [(c.cell_type, c.get("execution_count")) for c in b.cells]


@pytest.mark.skipif(importlib.util.find_spec("rfc3987_syntax") is None, reason="rfc3987_syntax is not installed")
def test_execute_leaves_out_jsonschemas_iri_grammar_and_still_validates(tmp_path: Path) -> None:
    """`execute`'s process imports nbformat without rfc3987_syntax (a 1.9 s grammar build that
    nbformat's validation never uses), and a malformed notebook is still refused as before."""
    bad = tmp_path / "bad.ipynb"
    cell = {"cell_type": "code", "id": "a", "source": "1", "metadata": {}, "outputs": [], "execution_count": "x"}
    bad.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell]}))
    probe = ("import sys\nfrom zeroboot_kernel import cli\ncli._leave_out_iri_grammar()\nimport nbformat\n"
             f"nb = nbformat.read({str(bad)!r}, as_version=4)\n"
             "try:\n    nbformat.validate(nb)\nexcept nbformat.ValidationError:\n    print('refused')\n"
             "print('rfc3987_syntax' in sys.modules and sys.modules['rfc3987_syntax'] is not None)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["refused", "False"]


def test_engine_refuses_a_checkpoint_policy_or_request_it_does_not_know() -> None:
    """new_session's `checkpoints` and execute's `checkpoint` are checked by the engine: a bad value
    is an error reply, the session stays as it was."""
    from zeroboot_kernel import engine_requests as req
    from zeroboot_kernel.engine_client import EngineClient

    client = EngineClient()
    try:
        reply = client.call(req.NEW_SESSION, mode="chained", checkpoints="sometimes")
        assert reply["status"] == "error" and "checkpoints must be one of" in reply["evalue"], reply
        reply = client.call(req.EXECUTE, code="x = 1", execution_count=1, checkpoint="yes")
        assert reply["status"] == "error" and "checkpoint must be true or false" in reply["evalue"], reply
        reply = client.call(req.NEW_SESSION, mode="chained", checkpoints=req.REQUESTED)
        assert reply["status"] == "ok", reply
        reply = client.call(req.EXECUTE, code="x = 1", execution_count=1, checkpoint=False)
        assert reply["status"] == "ok", reply
        stats = client.call(req.STATS)["stats"]
        assert stats["checkpoints"] == 0, stats
    finally:
        client.close()
