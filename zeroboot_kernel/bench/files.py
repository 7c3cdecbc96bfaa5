"""`python -m zeroboot_kernel.bench files`: reading a large file of the notebook's folder.

A 200 MB file next to the notebook is read inside the guest (through the project mount, straight
from the host file into guest memory, no copy in host memory) and on the host, in the same run:
throughput in MB/s, and VM exits per MB for whole-file reads and for chunked reads.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..template import Template
from .common import markdown_table, results_dir, write_results

SIZE_MB = 200
CHUNKS = {"whole file": 0, "1 MiB reads": 1 << 20, "64 KiB reads": 64 << 10}


def _reader(path: str, chunk: int) -> str:
    if not chunk:
        return f"data = open({path!r}, 'rb').read(); n = len(data); del data"
    return (f"f = open({path!r}, 'rb', buffering=0)\nn = 0\nwhile True:\n    b = f.read({chunk})\n"
            f"    if not b: break\n    n += len(b)\nf.close()")


def _host_seconds(path: str, chunk: int) -> float:
    code = _reader(path, chunk)
    t = time.perf_counter()
    exec(compile(code, "<bench>", "exec"), {})
    return time.perf_counter() - t


def measure(size_mb: int = SIZE_MB) -> dict[str, Any]:
    template = Template.ensure()
    res: dict[str, Any] = {"size_mb": size_mb, "rows": {}}
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as d:
        path = os.path.join(d, "big.bin")
        with open(path, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(size_mb):
                f.write(block)
        with open(path, "rb") as f:  # warm the page cache once for both sides
            while f.read(8 << 20):
                pass
        with template.fork() as sb:
            sb.guest.mount_project(d, "readonly")
            for label, chunk in CHUNKS.items():
                exits0 = sb.guest.stats()["exits"]
                r = sb.execute(f"import time\nt = time.perf_counter()\n{_reader(path, chunk)}\n"
                               f"print(n, time.perf_counter() - t)")
                n, guest_s = r.stdout.split()
                assert int(n) == size_mb << 20, r
                exits = sb.guest.stats()["exits"] - exits0
                host_s = _host_seconds(path, chunk)
                res["rows"][label] = {"guest_mb_s": round(size_mb / float(guest_s), 1),
                                      "host_mb_s": round(size_mb / host_s, 1),
                                      "ratio": round(host_s / float(guest_s), 2),
                                      "exits_per_mb": round(exits / size_mb, 2)}
    return res


def markdown(res: dict[str, Any]) -> str:
    rows = [[label, v["guest_mb_s"], v["host_mb_s"], v["ratio"], v["exits_per_mb"]] for label, v in res["rows"].items()]
    return markdown_table([f"read of a {res['size_mb']} MB file", "guest MB/s", "host MB/s", "guest/host",
                           "exits per MB"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench files", description=__doc__)
    p.add_argument("--size-mb", type=int, default=SIZE_MB)
    p.add_argument("--json", default=None, help="default: bench/results/files.json")
    args = p.parse_args(argv)
    res = measure(args.size_mb)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "files.json", "files", res, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
