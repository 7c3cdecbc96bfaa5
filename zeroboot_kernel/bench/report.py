"""The performance report: docs/PERFORMANCE.md and its charts, rendered from the JSON results that
`python -m zeroboot_kernel.bench all` writes (`python -m zeroboot_kernel.bench report` re-renders
them without measuring again)."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from . import (batch, comms, common, engine, execve, files, hub, kernel, memory, network, peers, processes, scaling,
               soak, startup, syscalls)

log = logging.getLogger(__name__)

# section -> module with markdown(results); in report order
SECTIONS = {"engine": engine, "peers": peers, "kernel": kernel, "scaling": scaling, "files": files,
            "syscalls": syscalls, "startup": startup, "memory": memory, "batch": batch}
TITLES = {
    "engine": "Engine: forks, restores, live forks, template build",
    "peers": "A fresh sandbox per cell: zeroboot vs a process vs bubblewrap",
    "kernel": "Kernel round trips through jupyter_client, vs stock ipykernel",
    "scaling": "Scaling: forks and memory as live forks grow; cells/s per worker",
    "files": "Reading a large file of the notebook's folder",
    "syscalls": "Syscall-heavy work: small files, listings, walks, guest vs host",
    "startup": "Starting Python in a fresh VM; numpy speed inside the guest",
    "memory": "Data-heavy notebooks: checkpoint memory, big arrays, fills (vs ipykernel)",
    "network": "Downloading through the network egress policy",
    "batch": "Batch execution: many notebooks, zeroboot-kernel execute vs papermill vs nbconvert",
    "soak": "Soak: one kernel, thousands of mixed cells",
    "comms": "Widget round trips (comms), vs stock ipykernel",
    "execve": "execve of /bin/true: the guest's exec vs process creation on the host",
    "processes": "Processes: os.fork + os.waitpid and multiprocessing.Pool in the guest, vs host",
    "hub": "A JupyterHub class on one server, vs stock ipykernel",
}
# the text under the comms section (its numbers come from its own run, `bench comms`)
COMMS_NOTE = ("A slider moved in the frontend: the comm_msg, the observe callback that prints the value, the "
              "idle status. In the sandbox the message runs like a small cell: from the prepared checkpoint, "
              "then the next checkpoint is taken after the reply.")
# the text under the execve section
EXECVE_NOTE = ("The guest's row is exec alone (fork+wait is the processes section's): from just before os.execv "
               "in a fork of the template to the engine's exit event (execve, ld.so and libc start-up, exit_group; the guest's "
               "clock is the host's). A host process cannot exec without being created, so the host rows include "
               "process creation, which the guest row does not.")
# the text under the processes section (its numbers come from its own run, `bench processes`)
PROCESSES_NOTE = ("os.fork()+os.waitpid of the agent's CPython: a guest fork is a snapshot of the parent taken inside its "
                  "fork syscall (the pages it wrote since its last snapshot) and a new sandbox forked from it (its memory "
                  "mapped, the snapshot's pages applied); the child then runs on the engine's second executor VM (the "
                  "children's) while process 1 stays attached to its own, keeping its memslots and KVM's shadow pages "
                  "(before this, both re-attached one VM at each switch: two attaches per fork+wait and ~1,570 instead of "
                  "~1,060 first-touch faults). The second and third tables split one fork+wait: stamps in the parent and "
                  "the child (perf_counter_ns; the host's child runs on the other core at once, so its phases overlap), and "
                  "the engine's counters per fork (zb_stats proc_*; KVM's pf_fixed of both executors). What is left: "
                  "making the child (4-5.5 ms in these runs: the snapshot's dirty-page copy and the new sandbox's "
                  "mapping), the child's first run on a VM whose memslot is new to it (6-8 ms: its attach, 1-2 ms, and "
                  "~900-1,060 shadow faults), ending it (2-5 ms: its memory unmapped, its memslot deleted); the host's "
                  "load moves each by 1.5x between runs. The issue's target (a guest fork+wait "
                  "faster than the host's) is not met. "
                  "multiprocessing.Pool(2).map of 100 small tasks (pool start, map, close + join; 5 iterations) is a "
                  "sequence of forks and hand-overs between processes, each a process switch plus a compare of the shared "
                  "mappings' bytes (a few pages of semaphores: microseconds): it works, it is not fast.")
OPTIONAL = ("network", "soak", "comms", "execve", "processes", "hub")  # sections measured by their own runs, rendered when their results exist


def load(out: Path) -> dict[str, dict[str, Any]]:
    """The results in `out`, by section (sections without a file are left out)."""
    found = {}
    for name in [*SECTIONS, *OPTIONAL]:
        path = out / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    return found


def headline(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The numbers the README quotes, each with what it is compared with and the ratio."""
    e, p, k = res["engine"], res["peers"], res["kernel"]
    pub = common.PUBLISHED
    one = p["cases"]["1+1"]
    rows: dict[str, Any] = {
        "fork_p50_ms": e["fork_p50_ms"], "fork_p99_ms": e["fork_p99_ms"],
        "fork_first_batch_p50_ms": e["fork_first_batch_p50_ms"],
        "vs_zeroboot_fork_p50": round(pub["zeroboot"]["fork_p50_ms"] / e["fork_p50_ms"], 1),
        "vs_zeroboot_fork_p99": round(pub["zeroboot"]["fork_p99_ms"] / e["fork_p99_ms"], 1),
        "vs_e2b_create": round(pub["E2B"]["create_ms"] / e["fork_p50_ms"]),
        "fork_exec_p50_ms": e["fork_exec_p50_ms"], "restore_exec_p50_ms": e["restore_exec_p50_ms"],
        "fork_exec_parked_p50_ms": e["fork_exec_parked_p50_ms"],
        "vs_zeroboot_fork_exec": round(pub["zeroboot"]["fork_exec_ms"] / e["restore_exec_p50_ms"], 1),
        "concurrent_forks": e["concurrent_forks"], "concurrent_s": e["concurrent_s"],
        "idle_fork_uss_kb": e["idle_fork_uss_kb"], "unstarted_fork_uss_kb": e["unstarted_fork_uss_kb"],
        "isolated_cell_p50_ms": one["zeroboot"]["p50_ms"],
        "vs_subprocess_cell": one["subprocess"]["ratio_p50"],
        "kernel_1plus1_p50_ms": k["cases"]["1+1"][k["kernels"][0]]["p50_ms"],
        "ipykernel_1plus1_p50_ms": k["cases"]["1+1"][k["kernels"][1]]["p50_ms"],
        "kernel_vs_ipykernel_1plus1": k["cases"]["1+1"]["ratio_p50"],
        "template_build_s": e["template_build_s"],
    }
    if "bubblewrap" in one:
        rows["vs_bubblewrap_cell"] = one["bubblewrap"]["ratio_p50"]
    if "batch" in res:
        b = res["batch"]
        rows.update({"batch_notebooks": b["notebooks"], "batch_notebooks_per_s": b["tools"]["zeroboot"]["notebooks_per_s"],
                     "batch_papermill_per_s": b["tools"]["papermill"]["notebooks_per_s"],
                     "batch_vs_papermill": b["tools"]["papermill"]["zeroboot_speedup"],
                     "batch_vs_nbconvert": b["tools"]["nbconvert"]["zeroboot_speedup"]})
    return rows


def headline_markdown(h: dict[str, Any]) -> str:
    z, e2b = common.PUBLISHED["zeroboot"], common.PUBLISHED["E2B"]
    n = h["concurrent_forks"]
    rows = [
        ["fork of the template, p50 / p99 (steady state; first forks of a fresh process: "
         f"{h['fork_first_batch_p50_ms']:.3f} ms p50)", f"{h['fork_p50_ms']:.3f} / {h['fork_p99_ms']:.3f} ms",
         f"zeroboot {z['fork_p50_ms']} / {z['fork_p99_ms']} ms (published)",
         f"{h['vs_zeroboot_fork_p50']}x / {h['vs_zeroboot_fork_p99']}x faster"],
        ["a sandbox ready to run", f"{h['fork_p50_ms']:.3f} ms", f"E2B ~{e2b['create_ms']} ms (published)",
         f"{h['vs_e2b_create']}x faster"],
        ["isolated cell `print(1)`: pooled VM reset + run / new fork + run, on new memory / on a closed "
         "fork's parked memory",
         f"{h['restore_exec_p50_ms']:.1f} / {h['fork_exec_p50_ms']:.1f} / {h['fork_exec_parked_p50_ms']:.1f} ms",
         f"zeroboot fork+exec ~{z['fork_exec_ms']:.0f} ms (published)",
         f"{h['vs_zeroboot_fork_exec']}x faster / {h['fork_exec_p50_ms'] / z['fork_exec_ms']:.1f}x slower / "
         f"{z['fork_exec_ms'] / h['fork_exec_parked_p50_ms']:.1f}x faster"],
        ["isolated cell `1+1` vs a fresh `python -c` / bubblewrap per cell", f"{h['isolated_cell_p50_ms']:.1f} ms",
         "same run", f"{h['vs_subprocess_cell']}x / {h.get('vs_bubblewrap_cell', 'n/a')}x faster"],
        [f"{n:,} forks created", f"{h['concurrent_s'] * 1e3:.0f} ms",
         f"zeroboot {z['concurrent_1000_ms']} ms for 1,000 (published)",
         f"{z['concurrent_1000_ms'] / (h['concurrent_s'] * 1e3):.0f}x faster" if n == 1000 else ""],
        ["host memory per fork: unstarted / after one cell (USS)",
         f"{h['unstarted_fork_uss_kb']:.0f} / {h['idle_fork_uss_kb']:.0f} KiB",
         f"zeroboot ~{z['kb_per_fork']} KB (published)", ""],
        ["kernel round trip of `1+1` (chained, with checkpoint)", f"{h['kernel_1plus1_p50_ms']:.1f} ms",
         f"ipykernel {h['ipykernel_1plus1_p50_ms']:.1f} ms (same run, no isolation)",
         f"{h['kernel_vs_ipykernel_1plus1']}x slower"],
        ["template build (numpy)", f"{h['template_build_s']:.2f} s", "target <= 3 s", ""],
    ]
    if "batch_notebooks_per_s" in h:
        rows.append([f"{h['batch_notebooks']} small notebooks, `zeroboot-kernel execute --jobs 2`",
                     f"{h['batch_notebooks_per_s']:.2f} notebooks/s",
                     f"papermill {h['batch_papermill_per_s']:.2f}/s (same run, 2 at a time)",
                     f"{h['batch_vs_papermill']}x faster ({h['batch_vs_nbconvert']}x vs nbconvert)"])
    return common.markdown_table(["what (p50 unless said)", "zeroboot-kernel", "compared with", "ratio"], rows)


def _peers_chart(res: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    p, k = res["peers"], res.get("kernel")
    cases = list(p["cases"])
    fig, axes = plt.subplots(1, 2 if k else 1, figsize=(12 if k else 7, 4.2), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(p["sides"])
    for i, side in enumerate(p["sides"]):
        ax.barh([j + i * width for j in range(len(cases))], [p["cases"][c][side]["p50_ms"] for c in cases],
                height=width, label=side)
    ax.set_yticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms per cell, p50 (log scale, lower is better)")
    ax.set_title("A fresh sandbox per cell")
    ax.legend(fontsize=8)
    if k:
        ax = axes[0][1]
        kcases = list(k["cases"])
        for i, name in enumerate(k["kernels"]):
            ax.barh([j + i * 0.4 for j in range(len(kcases))], [k["cases"][c][name]["p50_ms"] for c in kcases],
                    height=0.4, label=name if i else f"{name} (VM per cell)")
        ax.set_yticks([j + 0.2 for j in range(len(kcases))], kcases)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("execute round trip ms, p50 (log scale)")
        ax.set_title("Kernel round trip vs ipykernel")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _scaling_chart(res: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    s = res["scaling"]
    n = [r["live_forks"] for r in s["forks"]]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.8))
    a.plot(n, [r["fork_p50_ms"] for r in s["forks"]], "o-", label="p50")
    a.plot(n, [r["fork_p99_ms"] for r in s["forks"]], "s--", label="p99")
    a.set(xscale="log", xlabel="live forks", ylabel="ms", title="Fork latency")
    a.legend()
    for key, label in (("uss_kb_per_fork", "USS"), ("pss_kb_per_fork", "PSS"), ("host_kb_per_fork", "MemAvailable")):
        b.plot(n, [r[key] for r in s["forks"]], "o-", label=label)
    b.set(xscale="log", xlabel="live forks (each ran one cell)", ylabel="KiB per fork", title="Host memory per fork")
    b.legend()
    c.bar(["1 worker", "2 workers"], [s["cells_per_s_1_worker"], s["cells_per_s_2_workers"]])
    c.set(ylabel="isolated cells / s", title="Throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def default_report() -> Path:
    return common.results_dir().parent.parent / "docs" / "PERFORMANCE.md"


def render(res: dict[str, dict[str, Any]], out: Path, report: Path, command: str) -> Path:
    """Write `report` (markdown) and its charts (in report's folder, img/) from the results `res`
    that `load(out)` read."""
    missing = [name for name in SECTIONS if name not in res]
    if missing:
        raise FileNotFoundError(f"no results for {', '.join(missing)} in {out}: run "
                                f"`python -m zeroboot_kernel.bench all --out {out}` first")
    img = report.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    _peers_chart(res, img / "peers.png")
    _scaling_chart(res, img / "scaling.png")
    m = res["engine"]["machine"]
    try:
        where = out.resolve().relative_to(common.PACKAGE_ROOT)
    except ValueError:
        where = out.resolve()
    kvm = ", ".join(m.get("kvm_modules", [])) or "none listed in /sys/module"
    summary = headline_markdown(headline(res))
    parts = [
        "# Performance\n",
        f"Measured {res['engine']['date'][:10]} on {m.get('cpu', '?')}, {m.get('cpus')} CPUs, "
        f"KVM modules: {kvm}; Python {m.get('python')}; with\n\n"
        f"    {command}\n\n"
        f"which wrote the raw results (JSON, one file per section) to `{where}/`. On this host every VM exit "
        "costs 20-45 us and a guest's first touch of a page 8-20 us (nested KVM through `kvm_pvm`); "
        "published numbers of other projects come from other machines and are marked as such. Every "
        "ratio compares numbers measured in the same run, except where a published number is named.\n",
        "## Summary\n", summary,
        "\n![A fresh sandbox per cell, and kernel round trips](img/peers.png)\n",
        "![Scaling](img/scaling.png)\n",
    ]
    for name in SECTIONS:
        parts.append(f"## {TITLES[name]}\n\n{SECTIONS[name].markdown(res[name]).strip()}\n")
    if "network" in res:  # from its own run (`bench network`): it needs a network policy
        parts.append(f"## {TITLES['network']}\n\nMeasured {res['network']['date'][:10]} with `python -m "
                     f"zeroboot_kernel.bench network` (a local server on 127.0.0.1).\n\n"
                     f"{network.markdown(res['network']).strip()}\n")
    if "soak" in res:  # from its own run (`bench soak`), which takes an hour at full size
        chart = "img/soak.png" if (img / "soak.png").exists() else None
        body = soak.markdown(res["soak"], chart).split("\n", 1)[1]  # without its own title
        parts.append(f"## {TITLES['soak']}\n\nMeasured {res['soak']['date'][:10]} with `python -m zeroboot_kernel.bench "
                     f"soak --cells {res['soak']['cells']} --chart docs/img/soak.png`.\n{body.rstrip()}\n")
    if "comms" in res:  # from its own run (`bench comms`)
        parts.append(f"## {TITLES['comms']}\n\nMeasured {res['comms']['date'][:10]} with `python -m "
                     f"zeroboot_kernel.bench comms --iterations {res['comms']['iterations']}`. {COMMS_NOTE}\n\n"
                     f"{comms.markdown(res['comms']).strip()}\n")
    if "execve" in res:  # from its own run (`bench execve`)
        parts.append(f"## {TITLES['execve']}\n\nMeasured {res['execve']['date'][:10]} with `python -m "
                     f"zeroboot_kernel.bench execve --runs {res['execve']['runs']}`. {EXECVE_NOTE}\n\n"
                     f"{execve.markdown(res['execve']).strip()}\n")
    if "processes" in res:  # from its own run (`bench processes`)
        parts.append(f"## {TITLES['processes']}\n\nMeasured {res['processes']['date'][:10]} with `python -m "
                     f"zeroboot_kernel.bench processes --iterations {res['processes']['iterations']}`. {PROCESSES_NOTE}\n\n"
                     f"{processes.markdown(res['processes']).strip()}\n")
    if "hub" in res:  # from its own run (`bench hub`): it starts a JupyterHub and N servers per kind
        parts.append(f"## {TITLES['hub']}\n\nMeasured {res['hub']['date'][:10]} with `python -m "
                     f"zeroboot_kernel.bench hub --students {res['hub']['students']} --runs {res['hub']['runs']}`.\n\n"
                     f"{hub.markdown(res['hub']).strip()}\n")
    report.write_text("\n".join(parts))
    log.info("wrote %s and %s", report, img)
    if report.resolve() == default_report().resolve():
        update_readme(common.PACKAGE_ROOT / "README.md", res["engine"]["date"][:10], summary)
    return report


README_BEGIN = "<!-- performance summary: written by `python -m zeroboot_kernel.bench all` -->"
README_END = "<!-- end of performance summary -->"


def update_readme(readme: Path, date: str, table: str) -> None:
    """Put the summary table between the README's markers, so that the README quotes the latest
    full run (a README without the markers is left alone)."""
    text = readme.read_text() if readme.exists() else ""
    if README_BEGIN not in text or README_END not in text:
        log.warning("%s has no performance-summary markers; not updated", readme)
        return
    head, rest = text.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    body = f"\nMeasured {date} (full results and charts: [docs/PERFORMANCE.md](docs/PERFORMANCE.md)):\n\n{table}"
    readme.write_text(f"{head}{README_BEGIN}{body}{README_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroboot_kernel.bench report", description=__doc__)
    p.add_argument("--out", type=Path, default=common.results_dir(), help="where the JSON results are")
    p.add_argument("--report", type=Path, default=None, help="default docs/PERFORMANCE.md")
    args = p.parse_args(argv)
    res = load(args.out)
    for name in SECTIONS:  # each section's markdown next to its JSON too, in case its format changed
        if name in res:
            (args.out / f"{name}.md").write_text(SECTIONS[name].markdown(res[name]))
    print(render(res, args.out, args.report or default_report(), "python -m zeroboot_kernel.bench all"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
