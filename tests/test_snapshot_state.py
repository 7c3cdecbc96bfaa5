"""The snapshot format per component (issue 12): each component's own save/load round-trips its
state and refuses truncated or corrupt input with an error, never a crash (a C harness built with the
engine's sources under ASan and UBSan: tests/host_c/snapshot_state_test.c); and a template written
in another state format is stale and rebuilt, never misread."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "tests" / "host_c" / "snapshot_state_test.c"
FLAGS = ["-O1", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing",
         "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
COMPONENTS = ["cpu", "signals", "threads", "process", "uart", "memory"]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("snapshot-state") / "snapshot_state_test"
    # the engine's sources and include flags as the extension is built from them (one source)
    build = [sys.executable, str(ROOT / "zeroboot_kernel" / "_build_native.py")]
    sources = subprocess.run([*build, "--print-sources"], check=True, capture_output=True, text=True).stdout.split()
    includes = [f for f in subprocess.run([*build, "--print-flags"], check=True, capture_output=True,
                                          text=True).stdout.split() if f.startswith("-I")]
    proc = subprocess.run(["gcc", *FLAGS, *includes, "-o", str(out), str(HARNESS), *sources, "-lrt", "-lpthread", "-lcrypto"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.without_kvm
@pytest.mark.parametrize("component", COMPONENTS)
def test_component_state_round_trips_and_refuses_corruption(harness: Path, component: str) -> None:
    proc = subprocess.run([str(harness), component], capture_output=True, text=True, timeout=300,
                          env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
                               "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"})
    assert proc.returncode == 0 and proc.stdout.strip() == f"ok {component}", proc.stdout + proc.stderr


# ---- templates of another state format ----

@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "zeroboot-kernel" / "templates"


def test_template_of_another_state_format_is_stale_and_rebuilt(cache: Path) -> None:
    from zeroboot_kernel import template as tmod
    from zeroboot_kernel.engine import Template, TemplateConfig, TemplateError

    config = TemplateConfig(name="fmt", preload=())
    current = tmod.state_format()
    with pytest.MonkeyPatch.context() as mp:  # an engine of the previous format wrote it
        mp.setattr(tmod, "state_format", lambda: current - 1)
        old = Template.build(config)
    assert json.loads((old.directory / "manifest.json").read_text())["state_format"] == current - 1
    with pytest.raises(TemplateError, match="stale"):
        Template.load("fmt", memory=config.memory)
    assert [t["status"] for t in tmod.list_templates()] == ["stale"]
    fresh = Template.ensure(config)
    assert json.loads((fresh.directory / "manifest.json").read_text())["state_format"] == current
    assert [t["status"] for t in tmod.list_templates()] == ["current"]
    with fresh.fork() as sb:
        assert sb.execute("1+1").result["text/plain"] == "2"


def test_state_file_of_another_format_is_refused_not_misread(cache: Path) -> None:
    """Even where the key matched (a hand-copied state.bin), the engine reads the format first."""
    from zeroboot_kernel import template as tmod
    from zeroboot_kernel.engine import Template, TemplateConfig, TemplateError

    config = TemplateConfig(name="fmt2", preload=())
    d = Template.build(config).directory
    state = d / "state.bin"
    data = bytearray(state.read_bytes())
    magic, fmt = struct.unpack_from("<QI", data, 0)
    assert fmt == tmod.state_format()
    struct.pack_into("<I", data, 8, fmt - 1)
    state.write_bytes(bytes(data))
    with pytest.raises(TemplateError, match=rf"format {fmt - 1} and this engine reads format {fmt}.*rebuild"):
        Template.load("fmt2", memory=config.memory)
    assert Template.ensure(config).fork().execute("1+1").status == "ok"  # rebuilt
