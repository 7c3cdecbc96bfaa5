"""`python -m zeroboot_kernel.bench sessions`: the per-process breakdown it reports sees a fork's
private pages, and its report renders (the full run starts 12 kernels: not a test)."""
from __future__ import annotations

import os

from zeroboot_kernel.bench import sessions
from zeroboot_kernel.native import Engine


def test_the_breakdown_counts_a_forks_private_pages_as_the_guests(template):
    Engine.default().release_parked()  # the fork's pages are its own, not a freed one's it took
    base = sessions.breakdown(os.getpid())
    sb = template.fork()
    try:
        sb.execute("blob = bytearray(8 << 20)\nblob[::4096] = b'x' * len(blob[::4096])")
        now = sessions.breakdown(os.getpid())
    finally:
        sb.close()
    assert now["guest_private_kb"] - base["guest_private_kb"] >= 8 << 10  # the 8 MiB the cell wrote
    assert set(now) == {"heap_anon_kb", "libraries_private_kb", "libraries_shared_pss_kb", "guest_private_kb",
                        "template_cache_pss_kb", "checkpoint_stores_kb"}


def test_the_report_has_a_row_per_part_and_the_live_forks():
    parts = {"kernel": {"heap_anon_kb": 27000.0}, "engine": {"guest_private_kb": 16000.0, "checkpoint_stores_kb": 30000.0}}
    kind = {"host_kb_per_session": 100000.0, "parts_kb": parts, "host_ratio_vs_ipykernel": 1.5}
    res = {"sessions": 2, "idle_s": 3.0, "cells": ["1"] * 6,
           "kinds": {"zeroboot": kind, "zeroboot-no-release": kind,
                     "python3": {"host_kb_per_session": 66000.0, "parts_kb": {"kernel": {"heap_anon_kb": 90000.0}}}},
           "live_forks": {"forks": 50, "code": "x = 1", "after_cell_kb": {"uss": 4800.0, "host": 4000.0},
                          "after_release_kb": {"uss": 3300.0, "host": 3000.0}, "released_kb_per_fork": 1600.0,
                          "release_ms_per_fork": 4.0}}
    text = sessions.markdown(res)
    assert "guest: private pages" in text and "checkpoints: page stores" in text
    assert "| kernel process: Python heap and anonymous memory | 26.4 | 26.4 | 87.9 |" in text
    assert "50 live forks after `x = 1`" in text and "4,800" in text
