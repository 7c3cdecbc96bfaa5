"""`python -m zeroboot_kernel.bench save`: saving and resuming a session holding 100 MB and 1 GB of
arrays (`--sizes`, default 100,1000; --quick 20).

Per size, in the same run, on the same disk: a Session in this process saved (session_save.capture: only the
pages not the template's, zstd when it pays) and resumed in a new session (session_save.resume);
the zeroboot kernel's `%sandbox save`, a Jupyter restart, `%sandbox resume` (round trips through
jupyter_client, with the engine channel's chunked transfer); and the stock ipykernel (`python3`)
pickling the same arrays to a file, a restart, and loading them, and the same with `dill` when it
is installed (the `bench` extra).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import session_save as ss
from ..session import Session
from ..template import Template
from .common import markdown_table, results_dir, write_results

SIZE_MB = 100
LARGE_MB = 1000
KEY = b"b" * 32


def _setup_code(size_mb: int) -> str:
    n = size_mb * (1 << 20) // 8 // 2  # half random (incompressible), half a ramp (compressible)
    return (f"import numpy as np\nrng = np.random.default_rng(0)\nnoise = rng.random({n})\n"
            f"ramp = np.arange({n}, dtype=np.float64)\ncheck = float(noise.sum() + ramp.sum())\n")


def _kernel_rows(size_mb: int, d: str) -> dict[str, Any]:
    from .kernel import OURS, STOCK, BenchKernel, _ensure_our_kernelspec

    _ensure_our_kernelspec()
    os.environ["ZEROBOOT_SAVE_DIR"] = d  # the kernels inherit it (BenchKernel passes os.environ)
    pkl = os.path.join(d, "ipykernel.pkl")
    steps = [(OURS, "zeroboot kernel: %sandbox save / resume", "%sandbox save bench", "%sandbox resume bench",
              os.path.join(d, "bench.zbsave")),
             (STOCK, "ipykernel: pickle.dump / load",
              f"import pickle\nwith open({pkl!r}, 'wb') as f: pickle.dump({{'noise': noise, 'ramp': ramp}}, f)",
              f"import pickle\nwith open({pkl!r}, 'rb') as f: globals().update(pickle.load(f))", pkl)]
    if importlib.util.find_spec("dill") is not None:  # the stock kernel runs in this environment
        dl = os.path.join(d, "ipykernel.dill")
        steps.append((STOCK, "ipykernel: dill.dump / load",
                      f"import dill\nwith open({dl!r}, 'wb') as f: dill.dump({{'noise': noise, 'ramp': ramp}}, f)",
                      f"import dill\nwith open({dl!r}, 'rb') as f: globals().update(dill.load(f))", dl))
    rows = {}
    for name, label, save, load, path in steps:
        k = BenchKernel(name, timeout=600)
        try:
            k.round_trip(_setup_code(size_mb))
            save_s = k.round_trip(save)
            k.restart()
            resume_s = k.round_trip(load)
            k.round_trip("assert float(noise.sum() + ramp.sum()) > 0")
        finally:
            k.close()
        rows[label] = {"save_s": round(save_s, 3), "resume_s": round(resume_s, 3),
                       "file_mb": round(os.path.getsize(path) / 1e6, 1), "pages": None}
    return rows


def measure(size_mb: int = SIZE_MB) -> dict[str, Any]:
    template = Template.ensure()
    res: dict[str, Any] = {"size_mb": size_mb}
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as d:
        path = Path(d) / "bench.zbsave"
        s = Session(template)
        try:
            r = s.execute(_setup_code(size_mb) + "print(check)", execution_count=1)
            assert r["status"] == "ok", r
            t = time.perf_counter()
            data, manifest = ss.capture(s, KEY, "bench")
            path.write_bytes(data)
            save_s = time.perf_counter() - t
        finally:
            s.close()
        del data
        s = Session(template)
        try:
            t = time.perf_counter()
            ss.resume(s, str(path), KEY)
            resume_s = time.perf_counter() - t
            out: list[str] = []
            r = s.execute("print(float(noise.sum() + ramp.sum()) == check)", execution_count=2,
                          on_stream=lambda name, text: out.append(text))
            assert "".join(out).strip() == "True", (r, out)
        finally:
            s.close()
        res["rows"] = {
            "zeroboot Session (in process)": {"save_s": round(save_s, 3), "resume_s": round(resume_s, 3),
                                              "file_mb": round(path.stat().st_size / 1e6, 1), "pages": manifest["pages"]},
            **_kernel_rows(size_mb, d),
        }
    return res


def measure_sizes(sizes: list[int]) -> dict[str, Any]:
    """measure() for each size, in one run."""
    return {"sizes": [measure(size) for size in sizes]}


def markdown(res: dict[str, Any]) -> str:
    tables = []
    for one in res.get("sizes", [res]):  # results written before --sizes hold one size
        rows = [[label, v["save_s"], v["resume_s"], v["file_mb"]] for label, v in one["rows"].items()]
        tables.append(markdown_table([f"{one['size_mb']} MB of numpy arrays", "save s", "resume / load s", "file MB"],
                                     rows))
    return "\n".join(tables)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench save", description=__doc__)
    p.add_argument("--sizes", default=None, metavar="MB,MB", help="sizes in MB (default 100,1000; --quick 20)")
    p.add_argument("--quick", action="store_true", help="20 MB only")
    p.add_argument("--json", default=None, help="default: bench/results/save.json")
    args = p.parse_args(argv)
    text = args.sizes or ("20" if args.quick else f"{SIZE_MB},{LARGE_MB}")
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        p.error(f"--sizes {text!r}: give sizes in MB separated by commas, e.g. 100,1000")
    res = measure_sizes(sizes)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "save.json", "save", res, table)
    print(table)
    return 0
