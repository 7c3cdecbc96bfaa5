"""The notebook's own files through the real kernel (issue 7 acceptance): a notebook executed by
nbclient from a temporary directory reads the files beside it, writes privately, and exports on
request; and the engine process is locked down (seccomp) unless read-write mode is chosen."""
from __future__ import annotations

import numpy as np
import nbformat
from nbclient import NotebookClient

from kernel_helpers import ensure_kernelspecs, kernel, plain, shell_reply

CELLS = [
    "import pandas as pd, numpy as np\ndf = pd.read_csv('data.csv')\nint(df.amount.sum())",
    "float(np.load('weights.npy').sum())",
    "df.to_csv('out.csv', index=False)",
    "print(open('out.csv').read())",
    "%sandbox diff",
    "%sandbox export out.csv",
]


def test_a_notebook_reads_its_folder_and_exports_on_request(tmp_path) -> None:
    ensure_kernelspecs()
    (tmp_path / "data.csv").write_text("name,amount\na,10\nb,32\n")
    np.save(tmp_path / "weights.npy", np.arange(4.0))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "zeroboot", "display_name": "zeroboot", "language": "python"}
    out_on_host = tmp_path / "out.csv"
    client = NotebookClient(nb, timeout=120, kernel_name="zeroboot", resources={"metadata": {"path": str(tmp_path)}})
    # stop before the export to see that the write stayed private
    nb.cells, export_cells = nb.cells[:5], nb.cells[5:]
    client.execute()
    texts = [plain("".join(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")) for o in c.outputs))
             for c in nb.cells]
    assert texts[0] == "42" and texts[1] == "6.0"
    assert "name,amount\na,10\nb,32" in texts[3]
    assert "A out.csv" in texts[4]
    assert not out_on_host.exists(), "the sandbox wrote into the host folder"
    nb.cells = nb.cells + export_cells
    client = NotebookClient(nb, timeout=120, kernel_name="zeroboot", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # a fresh kernel: the export runs after re-running the cells
    assert "1 file(s) written" in plain(nb.cells[-1].outputs[0]["text"])
    assert out_on_host.read_text() == "name,amount\na,10\nb,32\n"


def _run(kc, code: str) -> dict:
    msg_id = kc.execute(code)
    return shell_reply(kc, msg_id, timeout=60)["content"]  # skips a late kernel_info reply of wait_for_ready


def test_engine_is_locked_down_unless_readwrite(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with kernel("zeroboot") as (km, kc):
        assert _run(kc, "open('x.txt', 'w').write('private')")["status"] == "ok"
        reply = _run(kc, "%sandbox files readwrite")
        assert reply["status"] == "error" and "locked down" in reply["evalue"]
    assert not (tmp_path / "x.txt").exists()
    with kernel("zeroboot", ZEROBOOT_FILES="readwrite") as (km, kc):
        assert _run(kc, "open('x.txt', 'w').write('through')")["status"] == "ok"
    assert (tmp_path / "x.txt").read_text() == "through"
