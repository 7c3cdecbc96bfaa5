"""Notebook parameters, injected the way papermill injects them (`zeroboot-kernel execute -p`).

papermill (parameterize.py, translators.PythonTranslator) adds a code cell tagged
`injected-parameters` holding "# Parameters" and one `name = literal` line per parameter: right
after the first cell tagged `parameters`, in place of an earlier injected cell if the notebook has
one, else at the top; and records the parameters in the notebook's metadata.papermill. Values
given on the command line are typed as papermill's CLI types them (`_resolve_type`). Notebooks
parameterised for papermill run here unchanged, and the injected cell reads the same.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import nbformat

from .errors import ZerobootError

log = logging.getLogger(__name__)

PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
COMMENT = "# Parameters"


class ParameterError(ZerobootError, ValueError):
    """A parameter cannot be injected (a name that is not an identifier, a value of no JSON type)."""


def parse_cli_value(text: str) -> Any:
    """A `-p NAME VALUE` value as papermill's CLI types it: True/False/None, an int, a float,
    else the string itself."""
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def python_literal(value: Any, depth: int = 0) -> str:
    """The Python source papermill's translator writes for `value` (a JSON/YAML value)."""
    if depth > 32:
        raise ParameterError("a parameter value nests more than 32 levels deep")
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        escaped = value.encode("unicode_escape").decode("utf-8").replace('"', r"\"")
        return f'"{escaped}"'
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return str(value)
        return "float('nan')" if math.isnan(value) else "float('-inf')" if value < 0 else "float('inf')"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(str(k))}: {python_literal(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_literal(v, depth + 1) for v in value) + "]"
    raise ParameterError(f"parameter value {value!r} is not a string, number, boolean, None, list or dict")


def parameters_source(parameters: dict[str, Any]) -> str:
    lines = [COMMENT]
    for name, value in parameters.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ParameterError(f"parameter name {name!r} is not a Python identifier")
        lines.append(f"{name} = {python_literal(value)}")
    return "\n".join(lines) + "\n"


def _first_tagged(nb: nbformat.NotebookNode, tag: str) -> int:
    for i, cell in enumerate(nb.cells):
        if tag in cell.get("metadata", {}).get("tags", []):
            return i
    return -1


def inject_parameters(nb: nbformat.NotebookNode, parameters: dict[str, Any]) -> nbformat.NotebookNode:
    """Insert the injected-parameters cell into `nb` (in place, returned) as papermill does."""
    cell = nbformat.v4.new_code_cell(source=parameters_source(parameters))
    cell.metadata["tags"] = [INJECTED_TAG]
    injected, tagged = _first_tagged(nb, INJECTED_TAG), _first_tagged(nb, PARAMETERS_TAG)
    if injected >= 0:
        nb.cells[injected:injected + 1] = [cell]
    elif tagged >= 0:
        nb.cells.insert(tagged + 1, cell)
    else:
        log.warning("the notebook has no cell tagged 'parameters': the parameters go into a first cell")
        nb.cells.insert(0, cell)
    if not isinstance(nb.metadata.get("papermill"), dict):
        nb.metadata["papermill"] = {}
    nb.metadata["papermill"]["parameters"] = dict(parameters)
    return nb
