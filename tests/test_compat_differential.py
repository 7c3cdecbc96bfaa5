"""Differential compatibility test: the idiom battery (tests/compat_cells.py) under the stock
`python3` kernel (ipykernel) and under `zeroboot`, cell by cell, compared on outcome, MIME types,
normalised output text and payloads. docs/COMPATIBILITY.md lists every cell as `same` or
`differs` (with the reason); this test fails when a cell's comparison disagrees with that table,
so the document stays true in both directions.

    .venv/bin/python tests/test_compat_differential.py   # prints the per-cell report and the count
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compat_cells import CELLS, ENV, NOTEBOOK, PROJECT, Cell  # noqa: E402
from kernel_helpers import manager  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "COMPATIBILITY.md"
CELL_TIMEOUT = 120.0
START_TIMEOUT = 600.0  # the zeroboot kernel may build a template first (OPENBLAS_CORETYPE is in its key)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NORMALISE = [
    (re.compile(r"ipykernel_\d+"), "ipykernel_PID"),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0xADDR"),
    (re.compile(r"T_[0-9a-f]{5}"), "T_ID"),                      # pandas Styler table ids
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "UUID"),
    (re.compile("\\d+(?:\\.\\d+)?(?:e[+-]?\\d+)?\\s?(?:ns|\u00b5s|\u03bcs|us|ms|s|min)\\b"), "TIME"),
    (re.compile(r"[\d,]+ loops?"), "N loops"),
    (re.compile(r"\d+ runs?"), "N runs"),
]


def normalise(text: str) -> str:
    text = _ANSI.sub("", text)
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    return text


def make_project(root: Path) -> Path:
    for rel, content in PROJECT.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root / NOTEBOOK


def run_cell(kc: Any, cell: Cell) -> dict[str, Any]:
    """One cell: its reply and IOPub outputs, reduced to what the comparison looks at."""
    outputs: list[dict[str, Any]] = []

    def on_iopub(msg: dict[str, Any]) -> None:
        mt, c = msg["msg_type"], msg["content"]
        if mt == "stream":
            outputs.append({"type": "stream", "name": c["name"], "text": c["text"]})
        elif mt in ("display_data", "update_display_data", "execute_result"):
            outputs.append({"type": mt, "mimes": sorted(c.get("data", {})),
                            "text": str(c.get("data", {}).get("text/plain", ""))})
        elif mt == "error":
            outputs.append({"type": "error", "ename": c.get("ename"), "evalue": c.get("evalue"),
                            "text": "\n".join(c.get("traceback", []))})
        elif mt == "clear_output":
            outputs.append({"type": "clear_output"})

    def on_stdin(msg: dict[str, Any]) -> None:
        kc.input(cell.stdin if cell.stdin is not None else "")

    reply = kc.execute_interactive(cell.code, allow_stdin=cell.stdin is not None, timeout=CELL_TIMEOUT,
                                   output_hook=on_iopub, stdin_hook=on_stdin)
    content = reply["content"]
    return {"status": content.get("status"), "ename": content.get("ename"),
            "payload": [p.get("source") for p in content.get("payload", [])],
            "payload_text": [normalise(str((p.get("data") or {}).get("text/plain", p.get("text", ""))))
                             for p in content.get("payload", [])],
            "outputs": outputs}


def summary(result: dict[str, Any], compare: str) -> dict[str, Any]:
    """What must be equal between the kernels. Streams are compared as their concatenated text per
    stream name (how many messages carry it depends on timing under ipykernel too)."""
    streams: dict[str, str] = {}
    others: list[Any] = []
    for out in result["outputs"]:
        if out["type"] == "stream":
            streams[out["name"]] = streams.get(out["name"], "") + out["text"]
        elif out["type"] == "error":
            others.append(["error", out["ename"]] + ([normalise(str(out["evalue"])), normalise(out["text"])]
                                                      if compare == "text" else []))
        elif out["type"] == "clear_output":
            others.append(["clear_output"])
        else:
            others.append([out["type"], out["mimes"]] + ([normalise(out["text"])] if compare == "text" else []))
    got: dict[str, Any] = {"status": result["status"], "ename": result["ename"], "outputs": others,
                           "payload": result["payload"]}
    if compare == "text":
        got["streams"] = {k: normalise(v) for k, v in sorted(streams.items())}
        got["payload_text"] = result["payload_text"]
    else:
        got["streams"] = sorted(streams)
    return got


def run_battery(kernel_name: str, project: Path) -> dict[str, dict[str, Any]]:
    km = manager(kernel_name, **ENV)
    km.start_kernel(cwd=str(project))
    kc = km.client()
    kc.start_channels()
    results: dict[str, dict[str, Any]] = {}
    try:
        kc.wait_for_ready(timeout=START_TIMEOUT)
        for cell in CELLS:
            try:
                results[cell.id] = run_cell(kc, cell)
            except (TimeoutError, Empty) as exc:
                results[cell.id] = {"status": "timeout", "ename": type(exc).__name__, "payload": [],
                                    "payload_text": [], "outputs": []}
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
        else:
            km.cleanup_resources()
    return results


def documented() -> dict[str, str]:
    """docs/COMPATIBILITY.md's differential table: cell id -> 'same' | 'differs'."""
    if not DOC.exists():
        return {}
    text = DOC.read_text()
    section = text.split("<!-- differential:begin -->", 1)[1].split("<!-- differential:end -->", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 2 and cols[0].startswith("`") and cols[1] in ("same", "differs"):
            rows[cols[0].strip("`")] = cols[1]
    return rows


def compare_kernels() -> tuple[dict[str, bool], dict[str, tuple[Any, Any]]]:
    with tempfile.TemporaryDirectory(prefix="zb-compat-") as tmp:
        stock_dir, zb_dir = Path(tmp) / "stock", Path(tmp) / "zeroboot"
        # the same path layout for both (only the parent differs, and it is the same in both runs'
        # normalised text because cells print relative paths only)
        stock = run_battery("python3", make_project(stock_dir))
        zb = run_battery("zeroboot", make_project(zb_dir))
    same: dict[str, bool] = {}
    detail: dict[str, tuple[Any, Any]] = {}
    for cell in CELLS:
        a, b = summary(stock[cell.id], cell.compare), summary(zb[cell.id], cell.compare)
        same[cell.id] = a == b
        detail[cell.id] = (a, b)
    return same, detail


@pytest.fixture(scope="module")
def comparison() -> tuple[dict[str, bool], dict[str, tuple[Any, Any]]]:
    return compare_kernels()


def test_every_cell_is_documented() -> None:
    rows = documented()
    ids = [c.id for c in CELLS]
    assert len(ids) == len(set(ids)), "duplicate cell ids"
    assert sorted(rows) == sorted(ids), (f"docs/COMPATIBILITY.md and tests/compat_cells.py disagree: "
                                         f"undocumented {sorted(set(ids) - set(rows))}, "
                                         f"stale {sorted(set(rows) - set(ids))}")


def test_outcomes_match_the_documentation(comparison) -> None:
    same, detail = comparison
    rows = documented()
    wrong = {cid: (("same" if ok else "differs"), rows.get(cid)) for cid, ok in same.items()
             if ("same" if ok else "differs") != rows.get(cid)}
    report = "\n".join(f"{cid}: measured {got}, documented {doc}\n  python3:  {json.dumps(detail[cid][0])[:1500]}\n"
                       f"  zeroboot: {json.dumps(detail[cid][1])[:1500]}" for cid, (got, doc) in wrong.items())
    print(f"differential: {sum(same.values())} of {len(same)} cells behave as under ipykernel")
    assert not wrong, "docs/COMPATIBILITY.md is not true any more:\n" + report


def main() -> int:
    os.environ.setdefault("ZEROBOOT_COMPAT_REPORT", "1")
    t0 = time.monotonic()
    same, detail = compare_kernels()
    rows = documented()
    for cell in CELLS:
        mark = "same   " if same[cell.id] else "DIFFERS"
        doc = rows.get(cell.id, "undocumented")
        print(f"{mark} {cell.id:<28} (documented: {doc})")
        if not same[cell.id]:
            print(f"    python3:  {json.dumps(detail[cell.id][0])[:800]}")
            print(f"    zeroboot: {json.dumps(detail[cell.id][1])[:800]}")
    print(f"\n{sum(same.values())} of {len(same)} cells behave as under ipykernel "
          f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
