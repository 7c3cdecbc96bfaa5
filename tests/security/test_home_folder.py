"""Item 11 of issue 11: a notebook folder that is a home directory. Credential files and folders
(kernel_config.DEFAULT_HIDDEN) are hidden from the project mount in every files mode: not listed,
not readable, not creatable or replaceable on the host; the kernel says so with its first output;
a notebook folder equal to the guest's private /tmp fails with an error that says what to do."""
from __future__ import annotations

import json
import os

import pytest

from kernel_helpers import execute, kernel, plain, stream_text
from zeroboot_kernel.errors import SandboxError
from zeroboot_kernel.kernel import home_folder_note
from zeroboot_kernel.kernel_config import DEFAULT_HIDDEN, KernelConfigError, KernelSettings
from zeroboot_kernel.session import Session


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (h / ".netrc").write_text("machine x login me password hunter2")
    (h / ".config" / "gcloud").mkdir(parents=True)
    (h / ".config" / "gcloud" / "credentials.db").write_text("gcloud token")
    (h / ".config" / "app.toml").write_text("ok = true")
    (h / ".bash_history").write_text("export TOKEN=abc")
    (h / "analysis.csv").write_text("a,b\n1,2\n")
    return h


def host_state(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


PROBE = """
import os, json
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return type(exc).__name__
res = {
    "top": sorted(os.listdir(".")),
    "config": sorted(os.listdir(".config")),
    "read_key": attempt(lambda: open(".ssh/id_ed25519").read()),
    "read_netrc": attempt(lambda: open(".netrc").read()),
    "read_gcloud": attempt(lambda: open(".config/gcloud/credentials.db").read()),
    "stat_ssh": attempt(lambda: os.stat(".ssh")),
    "abs_key": attempt(lambda: open(os.getcwd() + "/.ssh/id_ed25519").read()),
    "dotdot": attempt(lambda: open(".config/../.netrc").read()),
    "write_netrc": attempt(lambda: open(".netrc", "w").write("replaced")),
    "mkdir_ssh": attempt(lambda: os.mkdir(".ssh")),
    "write_key": attempt(lambda: open(".ssh/authorized_keys", "w").write("attacker key")),
    "rename_over": attempt(lambda: (open("x.txt", "w").write("x"), os.rename("x.txt", ".bash_history"))),
    "symlink_in": attempt(lambda: os.symlink(".netrc", "link")),
    "read_link": open("link").read() if os.path.exists("link") else "FileNotFoundError",
    "history": open(".bash_history").read() if os.path.exists(".bash_history") else "FileNotFoundError",
    "readable": open("analysis.csv").read(),
}
print(json.dumps(res))
"""


@pytest.mark.parametrize("mode", ["overlay", "readonly", "readwrite"])
def test_credentials_in_a_home_folder_are_hidden(template, home, mode):
    before = host_state(home)
    s = Session(template, project_dir=str(home), files=mode, hidden=DEFAULT_HIDDEN)
    try:
        out: list[str] = []
        reply = s.execute(PROBE, execution_count=1, on_stream=lambda name, t: out.append(t))
        assert reply["status"] == "ok", reply
        res = json.loads("".join(out))
    finally:
        s.close()
    assert res["top"] == sorted([".config", "analysis.csv"])
    assert res["config"] == ["app.toml"]
    for key in ("read_key", "read_netrc", "read_gcloud", "stat_ssh", "abs_key", "dotdot"):
        assert res[key] == "FileNotFoundError", (key, res[key])
    text = json.dumps(res)
    for secret in ("PRIVATE KEY", "hunter2", "gcloud token", "TOKEN=abc"):
        assert secret not in text
    # overlay: the cell's own private .netrc/.bash_history (never the host's) may be read back
    assert res["read_link"] in ("FileNotFoundError", "replaced") and res["history"] in ("FileNotFoundError", "x")
    assert res["readable"] == "a,b\n1,2\n"
    after = host_state(home)
    if mode == "readwrite":
        # no host call reaches a hidden path: nothing created or replaced there
        for key in ("write_netrc", "mkdir_ssh", "write_key", "rename_over"):
            assert res[key] != "ok", (key, res[key])
        after.pop("x.txt", None)
    assert after == before


def test_the_hidden_list_is_a_setting(home):
    assert KernelSettings.from_env({}).hidden == DEFAULT_HIDDEN
    assert KernelSettings.from_env({"ZEROBOOT_HIDE": "none"}).hidden == ()
    assert KernelSettings.from_env({"ZEROBOOT_HIDE": ".ssh:secrets/"}).hidden == (".ssh", "secrets")
    with pytest.raises(KernelConfigError):
        KernelSettings.from_env({"ZEROBOOT_HIDE": "../x"})


def test_hiding_nothing_shows_everything(template, home):
    s = Session(template, project_dir=str(home), hidden=())
    try:
        out: list[str] = []
        s.execute("import os; print(sorted(os.listdir('.')))", execution_count=1, on_stream=lambda n, t: out.append(t))
    finally:
        s.close()
    assert ".ssh" in "".join(out) and ".netrc" in "".join(out)


def test_a_home_folder_is_announced(home, monkeypatch):
    monkeypatch.setenv("HOME", str(home))
    note = home_folder_note(os.path.realpath(home), DEFAULT_HIDDEN)
    assert note and "home directory" in note and ".ssh" in note and "ZEROBOOT_HIDE" in note
    assert home_folder_note(os.path.realpath(home / ".config"), DEFAULT_HIDDEN) is None


def test_the_kernel_says_so_in_its_first_output(home, monkeypatch):
    monkeypatch.chdir(home)
    with kernel("zeroboot", HOME=str(home)) as (km, kc):
        reply, msgs = execute(kc, "print(sorted(__import__('os').listdir('.')))")
        assert reply["status"] == "ok", reply
        assert "is a home directory" in plain(stream_text(msgs, "stderr"))
        listed = stream_text(msgs)
        assert "analysis.csv" in listed and ".ssh" not in listed and ".netrc" not in listed
        reply, msgs = execute(kc, "print(1)")
        assert stream_text(msgs, "stderr") == ""  # said once


def test_a_notebook_folder_at_the_guests_tmp_says_what_to_do(template):
    with pytest.raises(SandboxError, match="folder of its own"):
        Session(template, project_dir="/tmp")
