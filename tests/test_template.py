"""Templates on disk (issue 3): build, list, remove, and clear errors for corrupt or stale ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zeroboot_kernel.engine import Template, TemplateConfig, TemplateError
from zeroboot_kernel import template as tmod


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "zeroboot-kernel" / "templates"


CONFIG = TemplateConfig(name="t", preload=("numpy",))


def test_build_load_fork(cache: Path) -> None:
    built = Template.build(CONFIG)
    assert built.directory.parent == cache
    assert {"memory.img", "state.bin", "manifest.json"} <= {p.name for p in built.directory.iterdir()}
    manifest = json.loads((built.directory / "manifest.json").read_text())
    assert manifest["preload"] == ["numpy"] and manifest["ready"]["language_info"]["name"] == "python"
    loaded = Template.load("t")
    with loaded.fork() as sb:
        assert sb.execute("import numpy; numpy.__name__").result["text/plain"] == "'numpy'"


def test_missing_template_says_how_to_build(cache: Path) -> None:
    with pytest.raises(TemplateError, match="template build"):
        Template.load("nothing-here")


@pytest.mark.parametrize("damage", ["truncate-state", "garbage-state", "short-memory", "no-memory"])
def test_corrupt_template_is_an_error_not_a_crash(cache: Path, damage: str) -> None:
    d = Template.build(CONFIG).directory
    state, memory = d / "state.bin", d / "memory.img"
    if damage == "truncate-state":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif damage == "garbage-state":
        data = bytearray(state.read_bytes())
        for i in range(64, len(data), 97):
            data[i] ^= 0xA5
        state.write_bytes(bytes(data))
    elif damage == "short-memory":
        os.truncate(memory, 1 << 20)
    else:
        memory.unlink()
    with pytest.raises(TemplateError, match="rebuild"):
        Template.load("t")
    assert Template.ensure(CONFIG).fork().execute("1+1").status == "ok"  # rebuilt


def test_stale_template_is_rebuilt(cache: Path) -> None:
    d = Template.build(CONFIG).directory
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["key"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TemplateError, match="stale"):
        Template.load("t")
    assert [t["status"] for t in tmod.list_templates()] == ["stale"]
    fresh = Template.ensure(CONFIG)
    assert [t["status"] for t in tmod.list_templates()] == ["current"] and fresh.directory.exists()


def test_cli_build_list_rm(cache: Path) -> None:
    exe = [sys.executable, "-m", "zeroboot_kernel"]
    env = {**os.environ}
    r = subprocess.run(exe + ["template", "build", "--name", "cli", "--preload", "numpy"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "built in" in r.stderr
    r = subprocess.run(exe + ["template", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert "cli" in r.stdout and "current" in r.stdout
    r = subprocess.run(exe + ["template", "rm", "cli"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "removed" in r.stdout
    assert not list(cache.iterdir())


def test_environment_key_lists_the_distributions_importlib_metadata_finds() -> None:
    """The template key's list of installed distributions is read without importlib.metadata (an
    engine would import ~3 MiB of modules for it); it must be the same list, name and version."""
    import importlib.metadata

    from zeroboot_kernel.template import installed_distributions

    expected = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    assert len(expected) > 10
    assert installed_distributions() == expected


def test_an_engine_does_not_import_importlib_metadata_or_zstandard() -> None:
    """Every session's engine process pays for the modules it imports (issue 18's memory per
    session): the template key and saves must not pull these in at start-up."""
    import subprocess
    import sys

    code = ("import sys, zeroboot_kernel.engine_server, zeroboot_kernel.template as t; t._environment_id(); "
            "print(sorted(m for m in ('importlib.metadata', 'zstandard', 'email') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]", out.stdout
