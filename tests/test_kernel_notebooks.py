"""The demo notebooks run headless: nbclient executes each with its own kernelspec (as nbconvert
--execute does) and papermill injects parameters into the tour."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from kernel_helpers import NOTEBOOKS, ensure_kernelspecs, plain

NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))


def _outputs(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for o in _outputs(nb):
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type == "error":
            parts.append(f"{o.ename}: {o.evalue}")
        else:
            parts.append(str(o.get("data", {}).get("text/plain", "")))
    return plain("\n".join(parts))


def test_notebooks_are_committed_without_outputs() -> None:
    assert {p.name for p in NOTEBOOK_FILES} >= {"tour.ipynb", "teaching.ipynb"}
    for path in NOTEBOOK_FILES:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_notebook_executes_headless(path: Path) -> None:
    ensure_kernelspecs()
    nb = nbformat.read(path, as_version=4)
    kernel_name = nb.metadata.kernelspec.name
    assert kernel_name in ("zeroboot", "zeroboot-isolated")
    NotebookClient(nb, timeout=120, startup_timeout=60, kernel_name=kernel_name,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    mimes = {m for o in _outputs(nb) for m in o.get("data", {})}
    assert "image/png" in mimes and "text/html" in mimes, mimes
    # the only errors are the cells tagged to raise, and each is a rollback, not a lost session
    for cell in nb.cells:
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if errors:
            assert "raises-exception" in cell.metadata.get("tags", []), cell.source
            assert errors[0].ename in ("SandboxCrashed", "SandboxTimeout"), errors[0]
    text = _text(nb)
    if path.name == "tour.ipynb":
        assert "still here: 200 rows, counter = 1" in text
        assert "rewound 1 cell(s)" in text
        assert "False False" in text and "True True" in text  # isolated, then chained again
        assert "memory of the live fork" in text
    if path.name == "teaching.ipynb":
        assert "pi = 3.14159" in text and "answer defined: False" in text
        assert "the next cell runs as usual" in text


def test_papermill_injects_parameters_into_the_tour(tmp_path: Path) -> None:
    import papermill as pm

    ensure_kernelspecs()
    out = tmp_path / "tour-out.ipynb"
    # papermill fails a run on any error output, so the deliberate crash/timeout demos are off
    pm.execute_notebook(str(NOTEBOOKS / "tour.ipynb"), str(out), parameters={"n_points": 123, "error_demos": False},
                        kernel_name="zeroboot", cwd=str(NOTEBOOKS), progress_bar=False, execution_timeout=120,
                        start_timeout=60)
    nb = nbformat.read(out, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "n_points = 123" in injected[0].source
    text = _text(nb)
    assert "123 samples" in text and "still here: 123 rows" in text
    assert not [o for o in _outputs(nb) if o.output_type == "error"]
    assert json.loads(json.dumps(nb.metadata.papermill.parameters)) == {"n_points": 123, "error_demos": False}
