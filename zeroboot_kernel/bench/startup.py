"""`python -m zeroboot_kernel.bench startup`: what starting Python in a fresh VM costs, and how
fast numpy computes inside it, each next to the host doing the same.

Measured side by side in one run, interleaved so that drift hits both sides alike:
  - `zeroboot-kernel run -c pass` vs host `python -c pass` (the same interpreter);
  - the same with `-c 'import numpy'`;
  - in-process: Sandbox.boot + running `python -c pass` to its exit from a warm process, i.e. the
    engine's share without the CLI's own interpreter start and view scan;
  - numpy 512x512 float64 matmul, timed inside the guest and inside host Python (single-threaded
    BLAS on both sides, as in the guest), reported as time per matmul and the guest's speed
    relative to the host (target >= 0.95x). OpenBLAS picks its kernel from CPUID, and the guest's
    CPUID (KVM's supported set) can differ from the host process's: so the matmul runs twice, once
    with each side's own choice and once with the host's kernel forced on both
    (OPENBLAS_CORETYPE), which is the like-for-like comparison.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import common

MATMUL_LOOPS, MATMUL_REPS = 20, 5
MATMUL = """
import json, time
import numpy as np
rng = np.random.default_rng(0)
a, b = rng.random((512, 512)), rng.random((512, 512))
for _ in range(5):
    a @ b
reps = []
for _ in range({reps}):
    t = time.perf_counter()
    for _ in range({loops}):
        a @ b
    reps.append((time.perf_counter() - t) / {loops})
core = "unknown"
try:  # which OpenBLAS kernel this CPU got (numpy's bundled scipy-openblas)
    import ctypes, glob, os
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*")):
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            if hasattr(lib, name):
                getattr(lib, name).restype = ctypes.c_char_p
                core = getattr(lib, name)().decode()
                break
except Exception:
    pass
print("MATMUL=" + json.dumps({{"reps": sorted(reps), "core": core}}))
"""


def _env() -> dict[str, str]:
    from ..guest_view import THREAD_ENV

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(common.PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(THREAD_ENV)  # the host side runs BLAS single-threaded too, like the guest
    return env


def _zeroboot(code: str, env: dict[str, str] | None = None) -> list[str]:
    extra = [arg for k, v in (env or {}).items() for arg in ("--env", f"{k}={v}")]
    return [sys.executable, "-m", "zeroboot_kernel", "run", *extra, "-c", code]


def _host(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _in_process_runs(runs: int) -> list[float]:
    from ..guest_view import python_spec
    from ..runner import run_to_completion

    spec = python_spec(["-c", "pass"])
    samples = []
    for i in range(runs + 2):  # two warm-up runs: view scan, VM creation, page cache
        out, err = io.BytesIO(), io.BytesIO()
        start = time.perf_counter()
        status = run_to_completion(spec, timeout=60, stdout=out, stderr=err)
        elapsed = time.perf_counter() - start
        if status != 0:
            raise RuntimeError(f"in-process run exited {status}: {err.getvalue().decode()[-2000:]}")
        if i >= 2:
            samples.append(elapsed)
    return samples


def _matmul(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Median seconds per matmul and the OpenBLAS kernel used."""
    _, proc = common.time_command(cmd, env=env, cwd=str(common.PACKAGE_ROOT))
    result = json.loads(proc.stdout.split("MATMUL=", 1)[1])
    return result["reps"][len(result["reps"]) // 2], result["core"]


def _matmul_side_by_side(script: str, runs: int, env: dict[str, str], force: dict[str, str]) -> dict:
    """Interleaved guest/host matmul runs; `force` is extra environment for both sides."""
    samples: dict[str, list[float]] = {"zeroboot": [], "host": []}
    cores: dict[str, str] = {}
    for _ in range(runs):
        t, cores["zeroboot"] = _matmul(_zeroboot(script, force), env)
        samples["zeroboot"].append(t)
        t, cores["host"] = _matmul(_host(script), {**env, **force})
        samples["host"].append(t)
    stats = {side: common.summarize(xs) for side, xs in samples.items()}
    return {"seconds": stats, "samples": samples, "cores": cores, "forced_env": force,
            "speed_vs_host": stats["host"]["p50"] / stats["zeroboot"]["p50"]}


def measure(runs: int = 20, matmul_runs: int = 3, matmul_loops: int = MATMUL_LOOPS) -> dict[str, Any]:
    env, cwd = _env(), str(common.PACKAGE_ROOT)
    cases = {"pass": "pass", "import numpy": "import numpy"}
    samples: dict[str, dict[str, list[float]]] = {name: {"zeroboot": [], "host": []} for name in cases}
    for name, code in cases.items():  # warm the page cache and compiled bytecode first
        common.time_command(_zeroboot(code), env=env, cwd=cwd)
        common.time_command(_host(code), env=env, cwd=cwd)
    for _ in range(runs):
        for name, code in cases.items():
            samples[name]["zeroboot"].append(common.time_command(_zeroboot(code), env=env, cwd=cwd)[0])
            samples[name]["host"].append(common.time_command(_host(code), env=env, cwd=cwd)[0])
    in_process = _in_process_runs(runs)

    script = MATMUL.format(loops=matmul_loops, reps=MATMUL_REPS)
    own = _matmul_side_by_side(script, matmul_runs, env, {})
    host_core = own["cores"]["host"]
    same = _matmul_side_by_side(script, matmul_runs, env,
                                {"OPENBLAS_CORETYPE": host_core} if host_core != "unknown" else {})

    summary = {name: {side: common.summarize(xs) for side, xs in sides.items()} for name, sides in samples.items()}
    summary["in-process pass"] = {"zeroboot": common.summarize(in_process), "host": summary["pass"]["host"]}
    return {"runs": runs, "matmul_runs": matmul_runs, "matmul_loops": matmul_loops, "summary_seconds": summary,
            "matmul": {"same_kernel": same, "own_kernel": own},
            "matmul_speed_vs_host": same["speed_vs_host"],
            "samples_seconds": {"startup": samples, "in_process_pass": in_process}}


def markdown(data: dict[str, Any]) -> str:
    summary, same, own = data["summary_seconds"], data["matmul"]["same_kernel"], data["matmul"]["own_kernel"]
    rows = []
    for name, label in [("pass", "`run -c pass` vs `python -c pass`"),
                        ("import numpy", "`run -c 'import numpy'` vs `python -c 'import numpy'`"),
                        ("in-process pass", "in-process boot + `-c pass` to exit (engine only) vs `python -c pass`")]:
        z, h = summary[name]["zeroboot"]["p50"], summary[name]["host"]["p50"]
        rows.append([label, common.ms(z), common.ms(h), f"{z / h:.1f}x slower"])
    for label, mm in [(f"numpy 512x512 matmul, same OpenBLAS kernel on both ({same['cores']['host']})", same),
                      (f"numpy 512x512 matmul, each side's own kernel (guest {own['cores']['zeroboot']}, "
                       f"host {own['cores']['host']})", own)]:
        rows.append([label, common.ms(mm["seconds"]["zeroboot"]["p50"]), common.ms(mm["seconds"]["host"]["p50"]),
                     f"{mm['speed_vs_host']:.3f}x host speed"])
    table = common.markdown_table(["case (p50)", "zeroboot-kernel", "host", "ratio"], rows)
    notes = (f"\n{data['runs']} interleaved runs per start-up case; matmul (float64, single-threaded BLAS): "
             f"{data['matmul_runs']} processes per side, each the median of {MATMUL_REPS} x {data.get('matmul_loops', MATMUL_LOOPS)} matmuls, "
             "timed inside the guest/host. Target: >= 0.95x host speed with the same kernel.\n")
    return table + notes


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20, help="runs of each start-up case (default 20)")
    p.add_argument("--matmul-runs", type=int, default=3, help="processes per side for the matmul (default 3)")
    p.add_argument("--json", type=Path, default=common.results_dir() / "startup.json",
                   help="where to write the results (default bench/results/startup.json; a .md summary goes next to it)")
    args = p.parse_args(argv)
    data = measure(args.runs, args.matmul_runs)
    text = markdown(data)
    common.write_results(args.json, "startup", data, text)
    print(text)
    print(f"results: {args.json} (+ {args.json.with_suffix('.md').name})")
    return 0
