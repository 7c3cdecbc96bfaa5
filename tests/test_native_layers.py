"""The include graph of native/ follows the engine's layers (docs/ARCHITECTURE.md section 7).

Each layer has its own header; a header includes only the headers of its own layer and the ones
below, and so does each C file, except for the upward includes listed in UPWARD with their reason
(the cycles the doc reports). A new file must be given a layer here, a new upward include fails
until it is removed or listed (and explained in the doc), and a listed one that is gone must be
taken off the list. Reads the sources only: no build, no /dev/kvm.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.without_kvm

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
GUEST_ABI = ROOT / "guest" / "guest_abi.h"

# Bottom to top: (layer, its headers, its C files as glob patterns).
LAYERS: list[tuple[str, list[str], list[str]]] = [
    ("host", ["util.h", "serial.h", "guest_abi.h"], ["util.c", "seccomp.c", "mac.c"]),
    ("memory", ["memory.h", "shared_map_state.h"], ["guest_memory.c", "page_reprotect.c", "shared_map_state.c"]),
    ("vm", ["vm.h"], ["guest_layout.c", "kvm_vm.c", "cpu_state.c"]),
    ("process", ["process.h"], ["signals.c", "run_events.c", "threads.c", "proc_family.c"]),
    ("dev", ["dev.h"], ["uart16550.c", "vdso_page.c"]),
    ("net", ["net.h"], ["net_policy.c", "net_dns.c"]),
    ("sandbox state", ["sandbox_state.h"], []),
    ("fs", ["fs.h", "file_kinds.h", "shared_map.h", "inet.h"], ["fdtable.c", "fs_*.c", "file_*.c", "shared_map.c", "sock_loopback.c"]),
    ("linux", ["linux.h"], ["syscalls.c", "sys_*.c", "elf_loader.c", "syscall_sites.c"]),
    ("run loop", ["run.h"], ["run_loop.c", "run_threads.c"]),
    ("sandbox", ["sandbox.h"], ["sandbox.c"]),
    ("snapshot", ["snapshot.h"], ["snapshot.c", "snapshot_file.c", "family_run.c"]),
]
# The cffi contract: the API every layer implements a part of, includable anywhere.
PUBLIC = "zeroboot.h"

# Upward includes of C files, each with the declaration that makes it one. struct zb_sandbox
# (sandbox_state.h) embeds every lower layer's state, and the lower-layer functions that take a
# zb_sandbox * reach into it: that is the one cycle by design. The others are single declarations.
UPWARD: dict[tuple[str, str], str] = {
    ("util.c", "sandbox_state.h"): "zb_log appends to sb->log",
    ("guest_memory.c", "sandbox_state.h"): "zb_guest_ptr and the guest copies check against sb->mem",
    ("kvm_vm.c", "sandbox_state.h"): "attach and detach map sb->mem and load and save sb->cpu",
    ("signals.c", "sandbox_state.h"): "delivery reads sb->sig and writes the frame and sb->cpu",
    ("run_events.c", "sandbox_state.h"): "stop events, output and kicks live in the sandbox",
    ("proc_family.c", "sandbox_state.h"): "the family's members are sandboxes: their threads and signals",
    ("vdso_page.c", "sandbox_state.h"): "the clock page is sb->vdso_data, its bases sb->proc",
    ("cpu_state.c", "linux.h"): "a loaded pending syscall number is checked against ZB_SYSCALL_MAX",
    ("file_eventfd.c", "linux.h"): "the eventfd kind registers its own syscalls (zb_sys_eventfd_register)",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^">]+)[">]', re.M)


def _level_of_header(name: str) -> int:
    for level, (_, headers, _) in enumerate(LAYERS):
        if name in headers:
            return level
    raise AssertionError(f"{name} is included but has no layer: add it to LAYERS in {__file__}")


def _level_of_source(name: str) -> int:
    for level, (_, _, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatch(name, p) for p in patterns):
            return level
    raise AssertionError(f"native/{name} has no layer: add it to LAYERS in {__file__} "
                         "and to docs/ARCHITECTURE.md section 7")


def _quoted_includes(path: Path) -> list[str]:
    return [name for kind, name in INCLUDE.findall(path.read_text()) if kind == '"']


def _headers() -> list[Path]:
    return sorted(NATIVE.glob("*.h")) + [GUEST_ABI]


def test_every_file_of_native_has_a_layer() -> None:
    for h in _headers():
        if h.name != PUBLIC:
            _level_of_header(h.name)
    for c in NATIVE.glob("*.c"):
        _level_of_source(c.name)


def test_every_header_has_an_include_guard() -> None:
    for h in _headers():
        if h.name == "file_kinds.h":  # an X-macro list: included once per use, on purpose
            continue
        guard = re.search(r"^#ifndef (\w+)\n#define \1\b", h.read_text(), re.M)
        assert guard, f"{h.name}: no include guard (#ifndef ZB_..._H / #define ZB_..._H)"


def test_headers_include_only_their_own_layer_and_below() -> None:
    for h in _headers():
        if h.name == PUBLIC:
            assert not _quoted_includes(h), "zeroboot.h, the cffi contract, includes no engine header"
            continue
        level = _level_of_header(h.name)
        for inc in _quoted_includes(h):
            if inc == PUBLIC:
                continue
            assert _level_of_header(inc) <= level, (
                f"{h.name} ({LAYERS[level][0]}) includes {inc} ({LAYERS[_level_of_header(inc)][0]}), "
                "a higher layer: move the declaration it needs down")


def test_sources_include_only_their_own_layer_and_below_but_the_listed_cycles() -> None:
    seen = set()
    for c in sorted(NATIVE.glob("*.c")):
        level = _level_of_source(c.name)
        for inc in _quoted_includes(c):
            if inc == PUBLIC or _level_of_header(inc) <= level:
                continue
            assert (c.name, inc) in UPWARD, (
                f"{c.name} ({LAYERS[level][0]}) includes {inc} ({LAYERS[_level_of_header(inc)][0]}), "
                "a higher layer: move the declaration down or the code up (or list the cycle in UPWARD "
                "with its reason, and in docs/ARCHITECTURE.md section 7)")
            seen.add((c.name, inc))
    assert seen == set(UPWARD), f"listed upward includes that are gone (take them off): {set(UPWARD) - seen}"


def test_util_h_comes_before_every_system_header() -> None:
    """util.h defines _GNU_SOURCE, which must precede the first system header of a file."""
    util = (NATIVE / "util.h").read_text()
    first = re.search(r"^#(?!ifndef ZB_UTIL_H|define ZB_UTIL_H)(.*)$", util, re.M)
    assert first and first.group(1).strip() == "define _GNU_SOURCE", "util.h starts with #define _GNU_SOURCE"
    for path in sorted(NATIVE.glob("*.c")) + [h for h in _headers() if h.name not in
                                                ("util.h", "serial.h", PUBLIC, "file_kinds.h", "guest_abi.h")]:
        text = path.read_text()
        includes = INCLUDE.findall(text)
        assert includes, f"{path.name} includes nothing"
        if re.search(r"^#define _GNU_SOURCE$", text[:INCLUDE.search(text).start()], re.M):
            continue  # defines it itself, before any include
        kind, name = includes[0]
        assert kind == '"' and name not in ("serial.h", PUBLIC, "file_kinds.h", "guest_abi.h"), (
            f"{path.name}: its first #include must be a layer header (util.h first of all), not {name}")
