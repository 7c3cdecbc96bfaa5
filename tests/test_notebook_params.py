"""Parameters are injected as papermill injects them (notebook_params.py vs papermill itself)."""
from __future__ import annotations

import math
from typing import Any

import nbformat
import pytest
from nbformat import v4

from zeroboot_kernel import notebook_params as npm

pytestmark = pytest.mark.without_kvm

VALUES: list[dict[str, Any]] = [
    {"n": 3, "x": 2.5, "flag": True, "off": False, "nothing": None, "s": "plain"},
    {"s": 'quotes " and \\ backslash\nnewline\tand ünïcode'},
    {"nested": {"a": [1, 2.0, "three", None, {"b": False}], "k": "v"}, "empty": [], "e": {}},
    {"inf": math.inf, "ninf": -math.inf, "nan": math.nan, "big": 10 ** 30},
]


def _deep(n: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(n):
        value = [value]
    return {"x": value}


def _cells(tags: list[list[str]]) -> nbformat.NotebookNode:
    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for i, t in enumerate(tags):
        cell = v4.new_code_cell(f"cell_{i} = {i}")
        cell.metadata["tags"] = t
        nb.cells.append(cell)
    return nb


@pytest.mark.parametrize("layout", [[[], ["parameters"], []], [[], []], [["parameters"], ["injected-parameters"], []],
                                    [["x", "parameters"], ["parameters"]]], ids=["tagged", "untagged", "reinjected",
                                                                                  "two-tagged"])
@pytest.mark.parametrize("values", VALUES, ids=range(len(VALUES)))
def test_injection_matches_papermill(layout: list[list[str]], values: dict[str, Any]) -> None:
    from papermill.parameterize import parameterize_notebook

    theirs = _cells(layout)
    theirs.metadata["papermill"] = {}  # what papermill's loader adds before it parameterises
    theirs = parameterize_notebook(theirs, dict(values))
    ours = npm.inject_parameters(_cells(layout), dict(values))
    assert [c.source for c in ours.cells] == [c.source for c in theirs.cells]
    assert [c.metadata.get("tags") for c in ours.cells] == [c.metadata.get("tags") for c in theirs.cells]
    assert repr(ours.metadata.papermill.parameters) == repr(theirs.metadata.papermill.parameters)
    # and the injected source is Python that gives the values back
    (injected,) = [c for c in ours.cells if "injected-parameters" in c.metadata.tags]
    scope: dict[str, Any] = {}
    exec(injected.source, scope)  # noqa: S102 - our own generated literals
    for name, value in values.items():
        assert repr(scope[name]) == repr(value)


@pytest.mark.parametrize("text", ["True", "False", "None", "12", "-3", "1e3", "0.5", "nan", "inf", "word", "1,2", ""])
def test_cli_values_are_typed_as_papermill_types_them(text: str) -> None:
    from papermill.cli import _resolve_type

    assert repr(npm.parse_cli_value(text)) == repr(_resolve_type(text))


@pytest.mark.parametrize("params", [{"not an identifier": 1}, {"x; import os": 1}, {"x": object()}, _deep(40)])
def test_bad_parameters_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(npm.ParameterError):
        npm.parameters_source(params)
