"""The latency breakdown of `bench kernel` (issue 20): a cell's round trip cut into phases.

Every phase is the time between two stamps of one round trip, all on the host's CLOCK_MONOTONIC:
  * the client's own (request sent, reply and idle received), taken in the bench process;
  * the message headers the client sees (busy status, execute_reply, idle status: `date`, wall
    clock with microseconds, set when the kernel builds the message) and ipykernel's `started`
    metadata of the reply (execute_request begins), converted to monotonic time with the
    offset CLOCK_REALTIME - CLOCK_MONOTONIC read next to them. Both kernels have these;
  * for the zeroboot kernel started with ZEROBOOT_TRACE=1, the `zeroboot_trace` metadata of
    the reply: the kernel's, the engine's and the guest agent's stamps (latency_trace.py).
Phases that a kernel has no stamps for are left out of its rows, so the stock kernel's
"execute" phase stands next to the zeroboot kernel's split of the same span.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from . import common

# (label, start stamp, end stamp, stock ipykernel has it too)
PHASES: tuple[tuple[str, str, str, bool], ...] = (
    ("frontend message in (client send -> busy)", "c_send", "busy", True),
    ("ipykernel dispatch (busy -> execute_request started)", "busy", "started", True),
    ("ipykernel -> do_execute", "started", "k_enter", False),
    ("kernel: thread hop to the worker (asyncio.to_thread)", "k_enter", "k_worker", False),
    ("kernel: request encoded and sent", "k_worker", "k_sent", False),
    ("kernel -> engine (socketpair, engine wake-up)", "k_sent", "e_recv", False),
    ("engine -> guest (checkpoint bookkeeping, EXECUTE frame, vCPU entry)", "e_recv", "g_read", False),
    ("guest: agent before run_cell", "g_read", "g_run_start", False),
    ("guest: IPython run_cell (the cell, its output frames)", "g_run_start", "g_run_end", False),
    ("guest: reply built", "g_run_end", "g_done", False),
    ("DONE frame -> engine", "g_done", "e_done", False),
    ("agent back at its UART read (settle)", "e_done", "e_settled", False),
    ("engine reply -> kernel", "e_settled", "k_reply_in", False),
    ("kernel: thread hop back to the shell loop", "k_reply_in", "k_back", False),
    ("ipykernel: execute_reply built and sent", "k_back", "reply", False),
    ("execute (started -> execute_reply sent)", "started", "reply", True),
    ("reply -> idle status", "reply", "idle", True),
    ("idle -> client", "idle", "c_idle", True),
    ("round trip (client send -> idle received)", "c_send", "c_idle", True),
)
# A phase that is the sum of others above (shown, but not drawn as a bar of the waterfall).
SUMMARY_PHASES = ("execute (started -> execute_reply sent)", "round trip (client send -> idle received)")


def wall_offset_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC now (the same in every process of this host)."""
    a = time.monotonic_ns()
    wall = time.time_ns()
    b = time.monotonic_ns()
    return wall - (a + b) // 2


def to_monotonic(date: Any, offset_ns: int) -> int | None:
    """A message date (datetime or ISO string, as jupyter_client hands them) in monotonic ns."""
    if isinstance(date, str):
        from jupyter_client.jsonutil import parse_date

        date = parse_date(date)
    if not hasattr(date, "timestamp"):
        return None
    return round(date.timestamp() * 1e6) * 1000 - offset_ns


def stamps_of(c_send: int, c_idle: int, busy: Any, reply: dict[str, Any], idle: Any, offset_ns: int) -> dict[str, int]:
    """One round trip's stamps (monotonic ns): the client's, the messages', the kernel's trace."""
    out: dict[str, int] = {"c_send": c_send, "c_idle": c_idle}
    for name, date in (("busy", busy), ("reply", reply["header"].get("date")), ("idle", idle),
                       ("started", reply.get("metadata", {}).get("started"))):
        ns = to_monotonic(date, offset_ns) if date is not None else None
        if ns is not None:
            out[name] = ns
    trace = reply.get("metadata", {}).get("zeroboot_trace")
    if isinstance(trace, dict):
        out.update({k: v for k, v in trace.items() if isinstance(v, int)})
    return out


def phases(stamps: dict[str, int]) -> dict[str, float]:
    """The phases (ms) one round trip has both stamps of."""
    return {label: (stamps[b] - stamps[a]) / 1e6 for label, a, b, _ in PHASES if a in stamps and b in stamps}


def extras(stamps: dict[str, int]) -> dict[str, float]:
    """What is not a phase of the round trip: the previous cell's checkpoint (taken after its
    reply), how long this request waited for it, the guest's VM exits and syscalls."""
    out: dict[str, float] = {}
    if "e_ckpt_start" in stamps and "e_ckpt_end" in stamps:
        out["checkpoint after the previous reply (ms)"] = (stamps["e_ckpt_end"] - stamps["e_ckpt_start"]) / 1e6
        if "k_sent" in stamps:
            out["request waited for that checkpoint (ms)"] = max(0, stamps["e_ckpt_end"] - stamps["k_sent"]) / 1e6
    for key, label in (("exits", "VM exits per cell"), ("syscalls", "guest syscalls per cell")):
        if key in stamps:
            out[label] = float(stamps[key])
    if "run_ns" in stamps:
        out["time inside zb_sandbox_run (ms)"] = stamps["run_ns"] / 1e6
    return out


def clock_check(samples: Sequence[dict[str, int]]) -> dict[str, Any]:
    """Whether the guest's stamps (vDSO CLOCK_MONOTONIC) fall inside the host's bracket around
    them: e_push <= g_read <= g_done <= e_done. A guest clock ahead or behind would show here."""
    n = bad = 0
    lead = []   # g_read - e_push: >= 0 if the guest clock is not behind
    lag = []    # e_done - g_done: >= 0 if the guest clock is not ahead
    for s in samples:
        if not all(k in s for k in ("e_push", "g_read", "g_done", "e_done")):
            continue
        n += 1
        lead.append((s["g_read"] - s["e_push"]) / 1e3)
        lag.append((s["e_done"] - s["g_done"]) / 1e3)
        if not s["e_push"] <= s["g_read"] <= s["g_done"] <= s["e_done"]:
            bad += 1
    if not n:
        return {"n": 0}
    return {"n": n, "out_of_order": bad, "min_push_to_read_us": round(min(lead), 1),
            "min_done_to_engine_us": round(min(lag), 1)}


def summarize(samples: Sequence[dict[str, int]]) -> dict[str, Any]:
    """p50/p99 of every phase and extra over the round trips of one kernel and case."""
    per_phase: dict[str, list[float]] = {}
    per_extra: dict[str, list[float]] = {}
    for s in samples:
        for k, v in phases(s).items():
            per_phase.setdefault(k, []).append(v)
        for k, v in extras(s).items():
            per_extra.setdefault(k, []).append(v)

    def stats(xs: list[float]) -> dict[str, float]:
        return {"p50": round(common.percentile(xs, 50), 4), "p99": round(common.percentile(xs, 99), 4), "n": len(xs)}

    return {"phases": {k: stats(v) for k, v in per_phase.items()},
            "extras": {k: stats(v) for k, v in per_extra.items()},
            "clock": clock_check(samples)}


def _bar(start: float, width: float, scale: float, cells: int = 40) -> str:
    """A text bar of the waterfall: `start` blanks, then `width` (ms) of blocks."""
    a = int(round(start * scale))
    b = max(a + (1 if width > 0 else 0), int(round((start + width) * scale)))
    return "`" + "." * a + "#" * (b - a) + "." * max(0, cells - b) + "`"


def markdown(breakdown: dict[str, Any], ours: str, stock: str, traced: str) -> str:
    """Per case: a waterfall table (phases in order, p50 and p99 per kernel, a bar from the
    phase's start at the sum of the p50s before it), then what is off the round trip's path."""
    parts = []
    for case, by_kernel in breakdown["cases"].items():
        z, p = by_kernel.get(traced, {}), by_kernel.get(stock, {})
        zp, pp = z.get("phases", {}), p.get("phases", {})
        total = max([zp.get(SUMMARY_PHASES[1], {}).get("p50", 0.0), pp.get(SUMMARY_PHASES[1], {}).get("p50", 0.0), 1e-9])
        scale = 40 / total
        rows = []
        start_z = start_p = 0.0
        for label, _a, _b, shared in PHASES:
            zs, ps = zp.get(label), pp.get(label) if shared else None
            if zs is None and ps is None:
                continue
            summary = label in SUMMARY_PHASES
            bar_z = bar_p = ""
            if not summary and zs is not None:
                bar_z = _bar(start_z, zs["p50"], scale)
                start_z += zs["p50"]
            if label != SUMMARY_PHASES[1] and ps is not None:  # stock's execute is one span: drawn
                bar_p = _bar(start_p, ps["p50"], scale)
                start_p += ps["p50"]
            rows.append([f"**{label}**" if summary else label,
                         zs["p50"] if zs else "", zs["p99"] if zs else "", bar_z,
                         ps["p50"] if ps else "", ps["p99"] if ps else "", bar_p])
        table = common.markdown_table(
            ["phase", f"{ours} p50 ms", f"{ours} p99 ms", f"{ours} waterfall (p50)",
             f"{stock} p50 ms", f"{stock} p99 ms", f"{stock} waterfall (p50)"], rows)
        extra_rows = [[k, v["p50"], v["p99"]] for k, v in z.get("extras", {}).items()]
        clock = z.get("clock", {})
        text = f"**{case}** (`{breakdown['codes'][case]}`)\n\n{table}"
        if extra_rows:
            text += "\n" + common.markdown_table([f"{ours}, off the round trip's path", "p50", "p99"], extra_rows)
        if clock.get("n"):
            text += (f"\nGuest clock check ({clock['n']} cells): {clock['out_of_order']} with a guest stamp outside "
                     f"the host's bracket; closest: EXECUTE push -> guest read {clock['min_push_to_read_us']} us, "
                     f"guest DONE -> engine {clock['min_done_to_engine_us']} us.\n")
        parts.append(text)
    return "\n".join(parts)


def before_after(breakdown: dict[str, Any], before: str, after: str, stock: str) -> str:
    """Per case and phase: p50 of the baseline build, of this one, and of the stock kernel, all
    from the same interleaved run."""
    rows = []
    for case, by_kernel in breakdown["cases"].items():
        b, a, s = (by_kernel.get(k, {}).get("phases", {}) for k in (before, after, stock))
        for label, *_rest in PHASES:
            if label not in a and label not in b:
                continue
            pb, pa = b.get(label, {}).get("p50"), a.get(label, {}).get("p50")
            ps = s.get(label, {}).get("p50", "")
            change = f"{pa - pb:+.3g}" if pa is not None and pb is not None else ""
            rows.append([case, label, "" if pb is None else pb, "" if pa is None else pa, change, ps])
        eb, ea = by_kernel.get(before, {}).get("extras", {}), by_kernel.get(after, {}).get("extras", {})
        for label in ea:
            pb, pa = eb.get(label, {}).get("p50"), ea[label]["p50"]
            rows.append([case, f"({label})", "" if pb is None else pb, pa,
                         f"{pa - pb:+.3g}" if pb is not None else "", ""])
    return common.markdown_table(["case", "phase (p50 ms)", f"before: {before}", f"after: {after}", "change",
                                  stock], rows)


def chart(breakdown: dict[str, Any], ours: str, stock: str, traced: str, path: Any) -> None:
    """A waterfall PNG: per case one bar per kernel, its phases' p50s laid end to end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(breakdown["cases"])
    fig, axes = plt.subplots(len(cases), 1, figsize=(11, 1.6 * len(cases) + 1.5), squeeze=False)
    cmap = plt.get_cmap("tab20")
    colours = {label: cmap(i % 20) for i, (label, *_rest) in enumerate(PHASES)}
    labelled: set[str] = set()
    for ax, case in zip(axes[:, 0], cases):
        for row, (name, shown) in enumerate(((traced, ours), (stock, stock))):
            got = breakdown["cases"][case].get(name, {}).get("phases", {})
            start = 0.0
            for label, _a, _b, _shared in PHASES:
                if label == SUMMARY_PHASES[1] or label not in got:
                    continue
                if label == SUMMARY_PHASES[0] and name == traced:
                    continue  # drawn as its parts
                width = got[label]["p50"]
                ax.barh(row, width, left=start, color=colours[label], edgecolor="white", linewidth=0.5,
                        label=None if label in labelled else label)
                labelled.add(label)
                start += width
        ax.set_yticks([0, 1], [ours, stock])
        ax.set_title(f"{case} (p50 of each phase, ms)", fontsize=9, loc="left")
        ax.invert_yaxis()
    handles, labels = [], []
    for ax in axes[:, 0]:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.32, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
