"""`python -m zeroboot_kernel.bench save`: saving and resuming a session holding ~100 MB of arrays.

A session (the kernel's Session, in this process) makes the arrays; it is saved to a file
(session_save.capture: only the pages not the template's, zlib when it pays) and resumed in a
new session (session_save.resume). The same variables are pickled to a file and loaded again by a
plain host CPython, which is what a stock ipykernel does with pickle or dill (same run, same disk).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import session_save as ss
from ..session import Session
from ..template import Template
from .common import markdown_table, results_dir, write_results

SIZE_MB = 100
KEY = b"b" * 32


def _setup_code(size_mb: int) -> str:
    n = size_mb * (1 << 20) // 8 // 2  # half random (incompressible), half a ramp (compressible)
    return (f"import numpy as np\nrng = np.random.default_rng(0)\nnoise = rng.random({n})\n"
            f"ramp = np.arange({n}, dtype=np.float64)\ncheck = float(noise.sum() + ramp.sum())\n")


def _pickle_seconds(size_mb: int, path: str) -> tuple[float, float, int]:
    code = (_setup_code(size_mb) + "import pickle, time\n"
            f"t = time.perf_counter()\nwith open({path!r}, 'wb') as f: pickle.dump({{'noise': noise, 'ramp': ramp}}, f)\n"
            "save = time.perf_counter() - t\n"
            f"t = time.perf_counter()\nwith open({path!r}, 'rb') as f: d = pickle.load(f)\nload = time.perf_counter() - t\n"
            "assert float(d['noise'].sum() + d['ramp'].sum()) == check\nprint(save, load)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), os.path.getsize(path)


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
        pickle_save, pickle_load, pickle_size = _pickle_seconds(size_mb, str(Path(d) / "vars.pkl"))
        res["rows"] = {
            "zeroboot session save": {"save_s": round(save_s, 3), "resume_s": round(resume_s, 3),
                                      "file_mb": round(path.stat().st_size / 1e6, 1), "pages": manifest["pages"]},
            "pickle (host CPython, as ipykernel)": {"save_s": round(pickle_save, 3), "resume_s": round(pickle_load, 3),
                                                    "file_mb": round(pickle_size / 1e6, 1), "pages": None},
        }
    return res


def markdown(res: dict[str, Any]) -> str:
    rows = [[label, v["save_s"], v["resume_s"], v["file_mb"]] for label, v in res["rows"].items()]
    return markdown_table([f"{res['size_mb']} MB of numpy arrays", "save s", "resume / load s", "file MB"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench save", description=__doc__)
    p.add_argument("--size-mb", type=int, default=SIZE_MB)
    p.add_argument("--json", default=None, help="default: bench/results/save.json")
    args = p.parse_args(argv)
    res = measure(args.size_mb)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "save.json", "save", res, table)
    print(table)
    return 0
