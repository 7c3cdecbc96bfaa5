"""`python -m zeroboot_kernel.bench hub`: a class on one JupyterHub server, zeroboot against the
stock ipykernel in the same run.

A local JupyterHub (DummyAuthenticator, SimpleLocalProcessSpawner, the Python port of
configurable-http-proxy) is started in a temporary directory, on loopback ports only. For each
kernel kind in turn, N simulated students (`--students`, 10 with --quick, 50 by default) each:
get a user and an API token of their own, start their single-user server through the hub (all at
once), put a small teaching notebook (numpy, pandas, a matplotlib plot, prints) into it, open it as
JupyterLab does (a session through the server's REST API; OPEN_AT_ONCE students at a time) and,
once every student's kernel has
answered a kernel_info request, all run the notebook's cells at the same moment over the
kernel websocket through the hub's proxy (`--runs` times each). Every reply is checked (status
ok, the expected text, a PNG for the plot cell): a wrong output counts as a failure.

Reported per kind: cell round trips (execute_request sent -> execute_reply and idle status in)
p50/p99, failures, server and kernel start times, the class's wall time, and host memory per
student (the drop of MemAvailable, so KVM's and the kernel's own memory count too): once after
the servers started and once with every kernel live after its cells, so the kernel's share is
the difference. Students are the hub's one OS user here, so their zeroboot kernels share one
template cache; a hub with system users gives each user a template of their own
(docs/JUPYTERHUB.md).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from . import common
from .kernel import OURS, STOCK, _ensure_our_kernelspec

log = logging.getLogger(__name__)

# (code, what the cell's output must contain: text/plain of the result, stream text, or a PNG)
CELLS: tuple[tuple[str, str], ...] = (
    ("import numpy as np\nimport pandas as pd", ""),
    ("a = np.arange(40_000, dtype=float).reshape(200, 200) / 40_000\nround(float((a @ a.T).trace()), 3)", "13332.833"),
    ("df = pd.DataFrame({'x': range(100), 'y': [i * i for i in range(100)]})\nfloat(df.describe().loc['mean', 'y'])",
     "3283.5"),
    ("print('hello', sum(range(10)))", "hello 45"),
    ("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()", "image/png"),
    ("1 + 1", "2"),
)
SPAWN_POLL_S = 0.2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _notebook() -> dict[str, Any]:
    """The class's notebook as the contents API takes it (nbformat 4)."""
    cells: list[dict[str, Any]] = [{"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None}
             for code, _ in CELLS]
    return {"type": "notebook", "format": "json",
            "content": {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}}


def _hub_config(workdir: Path, port: int, hub_port: int, proxy_api_port: int, token: str,
                jupyter_path: str | None) -> str:
    """jupyterhub_config.py for the bench: loopback only, every file under workdir."""
    proxy = Path(sys.executable).with_name("configurable-http-proxy")
    env = {"XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")}
    if jupyter_path:
        env["JUPYTER_PATH"] = jupyter_path
    args = ["--allow-root"] if os.geteuid() == 0 else []
    lines = [
        "c = get_config()  # noqa: F821",
        f"c.JupyterHub.ip = '127.0.0.1'\nc.JupyterHub.port = {port}",
        f"c.JupyterHub.hub_ip = '127.0.0.1'\nc.JupyterHub.hub_port = {hub_port}",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{proxy_api_port}'",
        f"c.ConfigurableHTTPProxy.command = [{str(proxy)!r}]",
        f"c.JupyterHub.db_url = {('sqlite:///' + str(workdir / 'hub.sqlite'))!r}",
        f"c.JupyterHub.cookie_secret_file = {str(workdir / 'cookie_secret')!r}",
        f"c.JupyterHub.pid_file = {str(workdir / 'hub.pid')!r}",
        "c.JupyterHub.authenticator_class = 'dummy'",
        "c.JupyterHub.spawner_class = 'simple'",
        f"c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / 'home' / '{username}')!r}",
        f"c.Spawner.cmd = [{sys.executable!r}, '-m', 'jupyterhub.singleuser']",
        f"c.Spawner.args = {args!r}",
        f"c.Spawner.environment = {env!r}",
        "c.Spawner.start_timeout = 600\nc.Spawner.http_timeout = 600",
        "c.JupyterHub.concurrent_spawn_limit = 0",
        "c.JupyterHub.cleanup_servers = True\nc.JupyterHub.cleanup_proxy = True",
        f"c.JupyterHub.services = [{{'name': 'bench', 'api_token': {token!r}}}]",
        "c.JupyterHub.load_roles = [{'name': 'bench', 'services': ['bench'], "
        "'scopes': ['admin:users', 'admin:servers', 'tokens', 'list:users', 'read:users']}]",
    ]
    return "\n".join(lines) + "\n"


# Notebooks opened at once: the students' REST and websocket requests go through the proxy, and
# both tornado HTTP clients on that path (the bench's and the Python configurable-http-proxy's)
# serve 10 requests at a time and fail the others after 20 s in their queue; 25 students opening
# at once (each a kernel start) failed so. The cells then run at the same moment on the open
# websockets, which is what the bench measures.
OPEN_AT_ONCE = 8

@dataclass
class Hub:
    """A running JupyterHub; `api` talks to its REST API with the bench service's token: the hub's
    own API (`/hub/...`) at the hub's port, as a JupyterHub service does (JUPYTERHUB_API_URL),
    and the students' servers (`/user/...`) through the proxy, as a browser does. (Through the
    proxy, 25 server starts at once made the Python proxy answer 503 "Timeout in request queue":
    each start's request is held ~10 s by the hub's slow_spawn_timeout.)"""
    url: str
    api_url: str
    token: str
    process: subprocess.Popen[bytes]
    log_path: Path

    async def api(self, method: str, path: str, body: Any = None, token: str | None = None,
                  timeout: float = 600.0) -> Any:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        client = AsyncHTTPClient()
        data = None if body is None else json.dumps(body)
        if data is None and method in ("POST", "PUT", "PATCH"):
            data = ""
        try:
            base = self.api_url if path.startswith("/hub/") else self.url
            resp = await client.fetch(base + path, method=method, body=data, request_timeout=timeout,
                                      headers={"Authorization": f"token {token or self.token}",
                                               "Content-Type": "application/json"})
        except HTTPClientError as exc:
            detail = exc.response.body.decode(errors="replace")[:500] if exc.response is not None else ""
            raise RuntimeError(f"{method} {path}: HTTP {exc.code} {detail}\nthe hub's log ends:\n"
                               f"{self.log_tail()}") from None
        return json.loads(resp.body) if resp.body else None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


@contextlib.contextmanager
def running_hub(timeout: float, jupyter_path: str | None) -> Iterator[Hub]:
    """Start a JupyterHub in a temporary directory and stop it (and every server) afterwards."""
    if shutil.which("configurable-http-proxy", path=str(Path(sys.executable).parent)) is None:
        raise RuntimeError("bench hub needs jupyterhub and configurable-http-proxy in this environment: "
                           "pip install -e '.[bench]'")
    workdir = Path(tempfile.mkdtemp(prefix="zeroboot-bench-hub-"))
    token = secrets.token_hex(32)
    port, hub_port = _free_port(), _free_port()
    (workdir / "jupyterhub_config.py").write_text(
        _hub_config(workdir, port, hub_port, _free_port(), token, jupyter_path))
    log_path = workdir / "hub.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(workdir / "jupyterhub_config.py")],
                                cwd=workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    hub = Hub(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{hub_port}", token, proc, log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited {proc.returncode}:\n{hub.log_tail()}")
            try:  # the proxy listens before the hub has added its own route: ask the hub's API
                with urllib.request.urlopen(f"{hub.url}/hub/api/", timeout=5) as resp:
                    if resp.status == 200 and "version" in json.loads(resp.read()):
                        break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyterhub did not listen within {timeout:.0f} s:\n{hub.log_tail()}") from None
                time.sleep(0.2)
        yield hub
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the hub stops its servers and the proxy (cleanup_*)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # whatever the hub left in its session (the proxy, when the hub died before stopping it)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)


def _message(msg_type: str, content: dict[str, Any], session: str) -> dict[str, Any]:
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "student", "session": session,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "5.3"}
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell",
            "buffers": []}


@dataclass
class Student:
    """One simulated student: a hub user with a server, a notebook session and its websocket."""
    hub: Hub
    name: str
    kernel: str
    timeout: float
    token: str = ""
    session_id: str = ""
    ws: Any = None
    session: str = field(default_factory=lambda: uuid.uuid4().hex)
    server_s: float = 0.0
    implementation: str = ""  # the kernel_info reply's: which kernel the hub really started
    kernel_s: float = 0.0
    times_ms: list[float] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")
    failures: list[str] = field(default_factory=list)

    async def start_server(self) -> None:
        t0 = time.perf_counter()
        await self.hub.api("POST", f"/hub/api/users/{self.name}")
        self.token = (await self.hub.api("POST", f"/hub/api/users/{self.name}/tokens",
                                         {"note": "bench hub", "expires_in": 7200}))["token"]
        await self.hub.api("POST", f"/hub/api/users/{self.name}/server")
        deadline = time.monotonic() + self.timeout
        while True:
            server = (await self.hub.api("GET", f"/hub/api/users/{self.name}"))["servers"].get("", {})
            if server.get("ready"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: server not ready within {self.timeout:.0f} s:\n{self.hub.log_tail()}")
            await asyncio.sleep(SPAWN_POLL_S)
        self.server_s = time.perf_counter() - t0

    async def open_notebook(self) -> None:
        """Put the notebook in the server, open it (a session, as JupyterLab does), kernel_info."""
        from tornado.httpclient import HTTPClientError, HTTPRequest
        from tornado.websocket import websocket_connect

        t0 = time.perf_counter()
        base = f"/user/{self.name}/api"
        await self.hub.api("PUT", f"{base}/contents/class.ipynb", _notebook(), token=self.token)
        sess = await self.hub.api("POST", f"{base}/sessions", {"path": "class.ipynb", "type": "notebook",
                                                                 "name": "class.ipynb", "kernel": {"name": self.kernel}},
                                  token=self.token, timeout=self.timeout)
        self.session_id = sess["id"]
        url = self.hub.url.replace("http://", "ws://") + f"{base}/kernels/{sess['kernel']['id']}/channels"
        try:
            self.ws = await websocket_connect(HTTPRequest(f"{url}?session_id={self.session}",
                                                          request_timeout=self.timeout,
                                                          headers={"Authorization": f"token {self.token}"}))
        except HTTPClientError as exc:
            raise RuntimeError(f"{self.name}: the kernel's websocket: HTTP {exc.code}; the hub's log ends:\n"
                               f"{self.hub.log_tail()}") from None
        deadline = time.monotonic() + self.timeout
        while True:  # the kernel may take a while to answer its first request: ask again until it does
            msg = _message("kernel_info_request", {}, self.session)
            await self.ws.write_message(json.dumps(msg))
            try:
                reply, _ = await self._collect(msg["header"]["msg_id"], min(10.0, self.timeout), idle=False)
                self.implementation = str(reply["content"].get("implementation", ""))
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: {self.kernel} kernel did not answer kernel_info") from None
        self.kernel_s = time.perf_counter() - t0

    async def _collect(self, msg_id: str, timeout: float, idle: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Messages answering msg_id until the reply (and the idle status if `idle`): (reply, outputs)."""
        reply: dict[str, Any] | None = None
        outputs: list[dict[str, Any]] = []
        idle_seen = not idle
        deadline = time.monotonic() + timeout
        while reply is None or not idle_seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(msg_id)
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise RuntimeError(f"{self.name}: the kernel websocket closed")
            if isinstance(raw, bytes):
                continue  # binary frames carry buffers (comms); no cell here sends any
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if msg.get("channel") == "shell" and kind.endswith("_reply"):
                reply = msg
            elif kind == "status" and msg["content"].get("execution_state") == "idle":
                idle_seen = True
            elif kind in ("stream", "execute_result", "display_data", "error"):
                outputs.append(msg)
        return reply, outputs

    async def run_cells(self, runs: int) -> None:
        for _ in range(runs):
            for code, expect in CELLS:
                msg = _message("execute_request", {"code": code, "silent": False, "store_history": True,
                                                   "user_expressions": {}, "allow_stdin": False,
                                                   "stop_on_error": True}, self.session)
                t0 = time.perf_counter()
                await self.ws.write_message(json.dumps(msg))
                try:
                    reply, outputs = await self._collect(msg["header"]["msg_id"], self.timeout)
                except (TimeoutError, RuntimeError) as exc:
                    self.failures.append(f"{code.splitlines()[0]!r}: {type(exc).__name__} {exc}")
                    return
                self.times_ms.append((time.perf_counter() - t0) * 1e3)
                self.slowest = max(self.slowest, (self.times_ms[-1], code.splitlines()[0]))
                problem = _check(reply, outputs, expect)
                if problem:
                    self.failures.append(f"{code.splitlines()[0]!r}: {problem}")

    async def stop(self) -> None:
        if self.ws is not None:
            self.ws.close()
        with contextlib.suppress(RuntimeError):
            if self.session_id:
                await self.hub.api("DELETE", f"/user/{self.name}/api/sessions/{self.session_id}", token=self.token)
            await self.hub.api("DELETE", f"/hub/api/users/{self.name}/server")
            deadline = time.monotonic() + self.timeout
            while (await self.hub.api("GET", f"/hub/api/users/{self.name}"))["servers"] and time.monotonic() < deadline:
                await asyncio.sleep(SPAWN_POLL_S)
            await self.hub.api("DELETE", f"/hub/api/users/{self.name}")


def _check(reply: dict[str, Any], outputs: list[dict[str, Any]], expect: str) -> str:
    """'' if the cell did what it should, else what went wrong."""
    if reply["content"].get("status") != "ok":
        return f"status {reply['content'].get('status')}: {reply['content'].get('evalue', '')}"
    if not expect:
        return ""
    for m in outputs:
        c = m["content"]
        if expect == "image/png":
            if "image/png" in c.get("data", {}):
                return ""
        elif expect in c.get("text", "") or expect == c.get("data", {}).get("text/plain", ""):
            return ""
    got = [m["content"].get("text") or m["content"].get("data", {}).get("text/plain") or m["header"]["msg_type"]
           for m in outputs]
    return f"expected {expect!r} in the output, got {got!r:.200}"


async def _class(hub: Hub, kernel: str, students: int, runs: int, timeout: float, tag: str) -> dict[str, Any]:
    """One kind: N students start, open the notebook, run it at once; results and memory."""
    before = common.mem_available_kb()
    group = [Student(hub, f"{tag}{i:03d}", kernel, timeout) for i in range(students)]
    try:
        await asyncio.gather(*(s.start_server() for s in group))
        servers_up = common.mem_available_kb()
        opening = asyncio.Semaphore(OPEN_AT_ONCE)

        async def open_notebook(s: Student) -> None:
            async with opening:
                await s.open_notebook()

        await asyncio.gather(*(open_notebook(s) for s in group))
        t0 = time.perf_counter()
        await asyncio.gather(*(s.run_cells(runs) for s in group))
        wall = time.perf_counter() - t0
        await asyncio.sleep(1.0)  # let the last checkpoints and frees settle before sampling
        live = common.mem_available_kb()
    finally:
        await asyncio.gather(*(s.stop() for s in group), return_exceptions=True)
    times = [t for s in group for t in s.times_ms]
    failures = [f"{s.name}: {f}" for s in group for f in s.failures]
    return {
        "p50_ms": round(common.percentile(times, 50), 2), "p99_ms": round(common.percentile(times, 99), 2),
        "cells": len(times), "failures": len(failures), "failure_examples": failures[:5],
        "implementations": sorted({s.implementation for s in group}),
        "wall_s": round(wall, 2), "slowest_cell": max((s.slowest for s in group), default=(0.0, "")),
        "server_start_p50_s": round(common.percentile([s.server_s for s in group], 50), 2),
        "kernel_start_p50_s": round(common.percentile([s.kernel_s for s in group], 50), 2),
        "memory_per_student_mib": round((before - live) / 1024 / students, 1),
        "server_memory_per_student_mib": round((before - servers_up) / 1024 / students, 1),
        "kernel_memory_per_student_mib": round((servers_up - live) / 1024 / students, 1),
    }


def measure(students: int = 50, runs: int = 3, timeout: float = 900.0,
            kinds: tuple[str, ...] = (OURS, STOCK)) -> dict[str, Any]:
    """A JupyterHub class of `students` per kernel kind, one kind after the other."""
    extra_path = _ensure_our_kernelspec()
    jupyter_path = os.pathsep.join(p for p in (extra_path, os.environ.get("JUPYTER_PATH")) if p) or None
    res: dict[str, Any] = {"students": students, "runs": runs, "cells_per_run": len(CELLS), "kinds": list(kinds),
                           "codes": [c for c, _ in CELLS]}
    from tornado.httpclient import AsyncHTTPClient

    AsyncHTTPClient.configure(None, max_clients=max(10, 4 * students))  # the default 10 would queue the class
    with running_hub(timeout, jupyter_path) as hub:
        for n, kind in enumerate(kinds):
            log.info("bench hub: %d students on %s", students, kind)
            res[kind] = asyncio.run(_class(hub, kind, students, runs, timeout, tag=f"s{n}x"))
    if OURS in res and STOCK in res:
        o, s = res[OURS], res[STOCK]
        res["ratio_p50"] = round(o["p50_ms"] / s["p50_ms"], 2)
        res["ratio_p99"] = round(o["p99_ms"] / s["p99_ms"], 2)
        res["ratio_memory"] = round(o["memory_per_student_mib"] / s["memory_per_student_mib"], 2) \
            if s["memory_per_student_mib"] > 0 else None
    return res


def markdown(res: dict[str, Any]) -> str:
    kinds = res["kinds"]
    rows = []
    for label, key in (("cell round trip p50 ms", "p50_ms"), ("cell round trip p99 ms", "p99_ms"),
                       ("cells run", "cells"), ("failures", "failures"), ("wall time of the class's run s", "wall_s"),
                       ("server start p50 s", "server_start_p50_s"), ("notebook open (kernel start) p50 s", "kernel_start_p50_s"),
                       ("host memory per student MiB", "memory_per_student_mib"),
                       ("of it: single-user server MiB", "server_memory_per_student_mib"),
                       ("of it: kernel after its cells MiB", "kernel_memory_per_student_mib")):
        vals = [res[k][key] for k in kinds]
        ratio = f"{vals[0] / vals[1]:.2f}x" if len(vals) == 2 and isinstance(vals[1], (int, float)) and vals[1] else ""
        rows.append([label, *vals, ratio])
    table = common.markdown_table(["JupyterHub class", *kinds, "ratio"], rows)
    return (f"{table}\n{res['students']} students per kind on one local JupyterHub (SimpleLocalProcessSpawner, "
            f"configurable-http-proxy), each with its own server, opening one notebook of {res['cells_per_run']} "
            f"cells (numpy, pandas, a matplotlib plot, prints) and running it {res['runs']} times, all students at "
            f"once, through the hub's proxy (REST + kernel websocket). Memory: the drop of the host's MemAvailable "
            f"per student.\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench hub", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--students", type=int, default=None, help="students per kind (default 50, --quick 10)")
    p.add_argument("--runs", type=int, default=None, help="times each student runs the notebook (default 3, --quick 1)")
    p.add_argument("--quick", action="store_true", help="10 students, one run each")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for one server start, kernel start or cell")
    p.add_argument("--json", type=Path, default=common.results_dir() / "hub.json",
                   help="where the results go (a .md summary is written next to it)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    students = args.students or (10 if args.quick else 50)
    runs = args.runs or (1 if args.quick else 3)
    logging.basicConfig(format="%(message)s")
    logging.getLogger(__package__).setLevel(logging.INFO)
    res = measure(students, runs, args.timeout)
    text = markdown(res)
    common.write_results(args.json, "hub", res, text)
    print(text)
    print(f"results: {args.json}")
    return 1 if any(res[k]["failures"] for k in res["kinds"]) else 0


if __name__ == "__main__":
    sys.exit(main())
