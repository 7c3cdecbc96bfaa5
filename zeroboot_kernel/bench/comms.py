"""`python -m zeroboot_kernel.bench comms`: the widget round trip of the zeroboot kernel next to
stock ipykernel (`python3`), in one run.

A round trip is what a slider's frontend waits for: from sending the comm_msg that moves an
IntSlider (`{"method": "update", "state": {"value": n}}`) until the idle status of that message,
having seen the observe callback's printed line. In the zeroboot kernel the message runs in the
sandbox like a small cell (a checkpoint to roll back to, the callback, the reply). The kernels
alternate message by message, so drift hits both alike. Results: p50/p90 per kernel and the
ratio, as a table and as JSON under bench/results/comms.json.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from queue import Empty
from typing import Any

from . import common
from .kernel import OURS, STOCK, BenchKernel, _ensure_our_kernelspec

SETUP = ("import ipywidgets as w\ns = w.IntSlider(value=0, max=10**9, description='bench')\n"
         "s.observe(lambda ch: print(ch['new']), names='value')")


class CommBench:
    """A kernel with one observed slider; moves it as a frontend would."""

    def __init__(self, name: str, timeout: float) -> None:
        self.kernel = BenchKernel(name, timeout)
        self.timeout = timeout
        kc = self.kernel.kc
        msg_id = kc.execute(SETUP)
        self.comm_id = ""
        for msg in self._until_idle(msg_id):
            state = msg["content"].get("data", {}).get("state", {}) if msg["msg_type"] == "comm_open" else {}
            if state.get("_model_name") == "IntSliderModel" and state.get("description") == "bench":
                self.comm_id = msg["content"]["comm_id"]
        if not self.comm_id:
            raise RuntimeError(f"{name}: the slider's comm_open never came (is ipywidgets installed?)")

    def _until_idle(self, msg_id: str) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = []
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.kernel.name}: no idle within {self.timeout} s")
            try:
                msg = self.kernel.kc.get_iopub_msg(timeout=remaining)
            except Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            msgs.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return msgs

    def round_trip(self, value: int) -> float:
        kc = self.kernel.kc
        t0 = time.perf_counter()
        msg = kc.session.msg("comm_msg", {"comm_id": self.comm_id, "data": {
            "method": "update", "state": {"value": value}, "buffer_paths": []}})
        kc.shell_channel.send(msg)
        msgs = self._until_idle(msg["header"]["msg_id"])
        elapsed = time.perf_counter() - t0
        printed = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
        if printed != f"{value}\n":
            raise RuntimeError(f"{self.kernel.name}: the callback printed {printed!r}, not {value}")
        return elapsed

    def close(self) -> None:
        self.kernel.close()


def measure(iterations: int = 100, warmup: int = 5, timeout: float = 120.0) -> dict[str, Any]:
    _ensure_our_kernelspec()
    benches = {name: CommBench(name, timeout) for name in (OURS, STOCK)}
    samples: dict[str, list[float]] = {name: [] for name in benches}
    try:
        for i in range(1, warmup + iterations + 1):
            for name, bench in benches.items():
                t = bench.round_trip(i)
                if i > warmup:
                    samples[name].append(t)
    finally:
        for bench in benches.values():
            bench.close()
    return {"iterations": iterations, "samples_ms": {k: [round(x * 1e3, 3) for x in v] for k, v in samples.items()},
            "summary_ms": {k: {s: round(v * 1e3, 3) if s != "n" else v for s, v in common.summarize(xs).items()}
                           for k, xs in samples.items()}}


def markdown(result: dict[str, Any]) -> str:
    ours, stock = result["summary_ms"][OURS], result["summary_ms"][STOCK]
    rows = [["slider update -> observe callback prints -> idle", ours["p50"], ours["p90"], stock["p50"], stock["p90"],
             f"{ours['p50'] / stock['p50']:.2f}x"]]
    return common.markdown_table(["case", "zeroboot p50 ms", "zeroboot p90 ms", "python3 p50 ms", "python3 p90 ms",
                                  "ratio p50"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench comms", description=__doc__)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/comms.json)")
    args = p.parse_args(argv)
    result = measure(args.iterations, args.warmup)
    text = markdown(result)
    common.write_results(args.out or common.results_dir() / "comms.json", "comms", result, text)
    print(text, end="")
    return 0
