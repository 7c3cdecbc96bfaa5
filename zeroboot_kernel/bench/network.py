"""`python -m zeroboot_kernel.bench network`: downloading a file through the sandbox's egress.

A local HTTP server on 127.0.0.1 (a process of its own) serves a file of SIZE_MB (200 MB, as
issue 17 asks; `--quick`: QUICK_MB, for CI) from memory;
the same download runs in a sandbox whose network policy allows that server (native/file_inet.c:
host sockets the engine made) and on the host, in the same run: urllib.request reading the body,
and a raw socket reading into one buffer with recv_into. Throughput in MB/s and VM exits per MB.
Only loopback traffic.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import network_policy
from ..native import Engine
from ..template import Template
from .common import markdown_table, results_dir, write_results

SIZE_MB = 200
QUICK_MB = 16


def _readers(port: int, size: int) -> dict[str, str]:
    url = f"http://127.0.0.1:{port}/blob"
    return {
        "urllib.request, read()": f"import urllib.request\nn = len(urllib.request.urlopen({url!r}).read())",
        "socket, recv_into 1 MiB": (
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}))\n"
            f"s.sendall(b'GET /blob HTTP/1.0\\r\\n\\r\\n')\nbuf = bytearray(1 << 20)\nn = 0\n"
            f"head = b''\nwhile True:\n    k = s.recv_into(buf)\n    if not k: break\n"
            f"    if len(head) < 4096: head += bytes(buf[:min(k, 4096)])\n    n += k\ns.close()\n"
            f"n -= head.index(b'\\r\\n\\r\\n') + 4  # the body's bytes"),
    }


# The server runs in its own process, so that it never competes for this process's GIL with the
# host-side client (the guest's client runs in KVM_RUN, which releases it).
SERVER = """
import http.server, sys
body = bytes(range(256)) * (int(sys.argv[1]) // 256)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


def _serve(size: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(size)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"the benchmark's HTTP server did not start (it said {line!r})")
    return proc, int(line)


def measure(size_mb: int = SIZE_MB) -> dict[str, Any]:
    size = size_mb << 20
    srv, port = _serve(size)
    engine = Engine.default()
    res: dict[str, Any] = {"size_mb": size_mb, "rows": {}}
    try:
        template = Template.ensure()
        engine.set_network(network_policy.parse(f"127.0.0.1:{port}"))
        with template.fork() as sb:
            for label, code in _readers(port, size).items():
                exits0 = sb.guest.stats()["exits"]
                r = sb.execute(f"import time\nt = time.perf_counter()\n{code}\nprint(n, time.perf_counter() - t)")
                n, guest_s = r.stdout.split()
                assert int(n) == size, r
                exits = sb.guest.stats()["exits"] - exits0
                t = time.perf_counter()
                scope: dict[str, Any] = {}
                exec(compile(code, "<bench>", "exec"), scope)
                host_s = time.perf_counter() - t
                assert scope["n"] == size
                res["rows"][label] = {"guest_mb_s": round(size_mb / float(guest_s), 1),
                                      "host_mb_s": round(size_mb / host_s, 1),
                                      "ratio": round(host_s / float(guest_s), 2),
                                      "exits_per_mb": round(exits / size_mb, 2)}
    finally:
        engine.set_network(None)
        srv.kill()
        srv.wait()
    return res


def markdown(res: dict[str, Any]) -> str:
    rows = [[label, v["guest_mb_s"], v["host_mb_s"], v["ratio"], v["exits_per_mb"]] for label, v in res["rows"].items()]
    return markdown_table([f"download of {res['size_mb']} MB from 127.0.0.1", "guest MB/s", "host MB/s", "guest/host",
                           "exits per MB"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench network", description=__doc__)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--size-mb", type=int, default=SIZE_MB, help=f"the file's size (default {SIZE_MB})")
    size.add_argument("--quick", action="store_const", const=QUICK_MB, dest="size_mb",
                      help=f"a {QUICK_MB} MB file (CI)")
    p.add_argument("--json", default=None, help="default: bench/results/network.json")
    args = p.parse_args(argv)
    if not 1 <= args.size_mb <= 1024:
        p.error("--size-mb must be 1..1024 (the guest holds the whole body in memory)")
    res = measure(args.size_mb)
    table = markdown(res)
    write_results(Path(args.json) if args.json else results_dir() / "network.json", "network", res, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
