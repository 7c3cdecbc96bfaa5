"""Kernel-side pieces without a VM: magic parsing, the history record, settings, kernelspec install."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zeroboot_kernel import magics as mg
from zeroboot_kernel import schema
from zeroboot_kernel.engine_client import EngineClient
from zeroboot_kernel.install import KERNEL_NAMES, Destination, InstallError, install_kernelspecs, \
    uninstall_kernelspecs
from zeroboot_kernel.kernel_config import KernelConfigError, KernelSettings
from zeroboot_kernel.kernel_history import CellHistory

pytestmark = pytest.mark.without_kvm

REPO = Path(__file__).resolve().parent.parent


# ---- magics ------------------------------------------------------------------------------------

def test_plain_code_has_no_magics() -> None:
    plan = mg.split_cell("x = 1\nprint(x)")
    assert plan.magics == () and plan.code == "x = 1\nprint(x)" and plan.touches_guest


def test_leading_magics_are_split_off() -> None:
    plan = mg.split_cell("# undo\n%rewind 2\n\n%sandbox mode isolated  # why not\nx = 1\n")
    assert plan.magics == (mg.Rewind(2), mg.SandboxCommand("mode", "isolated"))
    assert plan.code == "x = 1\n"


def test_magic_only_cell_does_not_touch_the_guest() -> None:
    plan = mg.split_cell("%sandbox stats\n   \n# nothing else\n")
    assert plan.magics == (mg.SandboxCommand("stats"),)
    assert not plan.touches_guest and plan.code == ""


@pytest.mark.parametrize("line, expected", [
    ("%rewind", mg.Rewind(1)),
    ("%rewind 3", mg.Rewind(3)),
    ("%sandbox", mg.SandboxCommand("help")),
    ("%sandbox help", mg.SandboxCommand("help")),
    ("%sandbox mode", mg.SandboxCommand("mode")),
    ("%sandbox mode chained", mg.SandboxCommand("mode", "chained")),
    ("%sandbox checkpoints", mg.SandboxCommand("checkpoints")),
    ("%sandbox stats", mg.SandboxCommand("stats")),
    ("%sandbox timeout", mg.SandboxCommand("timeout")),
    ("%sandbox timeout 2.5", mg.SandboxCommand("timeout", "2.5")),
    ("%sandbox reset", mg.SandboxCommand("reset")),
])
def test_magic_parsing(line: str, expected: mg.Magic) -> None:
    assert mg.split_cell(line).magics == (expected,)


@pytest.mark.parametrize("line, message", [
    ("%rewind 0", "N a whole number >= 1"),
    ("%rewind two", "N a whole number >= 1"),
    ("%rewind 1 2", "N a whole number >= 1"),
    ("%sandbox mode sideways", "chained|isolated"),
    ("%sandbox timeout -1", "SECONDS >= 0"),
    ("%sandbox timeout soon", "SECONDS >= 0"),
    ("%sandbox timeout nan", "SECONDS >= 0"),
    ("%sandbox stats now", "takes no arguments"),
    ("%sandbox frobnicate", "unknown %sandbox subcommand 'frobnicate'"),
])
def test_magic_usage_errors(line: str, message: str) -> None:
    with pytest.raises(mg.MagicUsageError, match=message.replace("|", r"\|").replace("%", "%")):
        mg.split_cell(line)


def test_kernel_magic_after_code_is_an_error() -> None:
    with pytest.raises(mg.MagicUsageError, match="before any code"):
        mg.split_cell("x = 1\n%rewind")
    with pytest.raises(mg.MagicUsageError, match="before any code"):
        mg.split_cell("if True:\n    %sandbox stats\n")


def test_kernel_magic_text_inside_strings_is_code() -> None:
    code = 's = """\n%rewind\n"""\nt = "%sandbox stats"'
    assert mg.split_cell(code) == mg.CellPlan((), code)
    # IPython's own magics are the guest's business
    assert mg.split_cell("%timeit 1+1").code == "%timeit 1+1"


def test_formatting() -> None:
    rows = [{"before_cell": 3, "code": "x = 1", "private_kib": 12, "age_s": 1.5},
            {"before_cell": 4, "code": "y = 2", "private_kib": 0, "age_s": 0.2}]
    text = mg.format_checkpoints(rows, "chained")
    assert "2 checkpoint(s)" in text and "x = 1" in text and "[4]" in text
    assert "no checkpoints" in mg.format_checkpoints([], "chained")
    assert "isolated mode" in mg.format_checkpoints([], "isolated")
    stats = {"mode": "chained", "template": {"name": "default", "preload": ["numpy"]}, "checkpoint_ms_p50": 1.0,
             "execute_ms_p50": None, "guest_memory_mib": 10.0, "guest_memory_limit_mib": 1024.0}
    text = mg.format_stats(stats, {"timeout": "none", "round_trip_ms_p50": 2.0, "engine_pid": 1})
    assert "1.00 ms" in text and "10.0 MiB of 1024.0 MiB" in text and "numpy" in text


# ---- history -----------------------------------------------------------------------------------

def _history() -> CellHistory:
    h = CellHistory()
    for line, src in enumerate(["a = 1", "1+2+3", "b = 2", "1+2+3", "print(a)"], start=1):
        h.record(line, src).output = "6" if src == "1+2+3" else None
    return h


def test_history_tail_range_search() -> None:
    h = _history()
    assert h.tail(2) == [(1, 4, "1+2+3"), (1, 5, "print(a)")]
    assert h.tail(1, output=True) == [(1, 5, ("print(a)", None))]
    assert h.range(0, 2, 4) == [(1, 2, "1+2+3"), (1, 3, "b = 2")]
    assert h.range(1, 4, None) == [(1, 4, "1+2+3"), (1, 5, "print(a)")]
    assert h.range(-1, 1, 3) == []  # no earlier sessions
    assert h.search("1?2*") == [(1, 2, "1+2+3"), (1, 4, "1+2+3")]
    assert h.search("1?2*", unique=True) == [(1, 4, "1+2+3")]
    assert h.search("*", n=2) == [(1, 4, "1+2+3"), (1, 5, "print(a)")]
    assert h.search("print*", output=True) == [(1, 5, ("print(a)", None))]
    assert h.search("A*") == []  # case sensitive, like IPython's GLOB
    assert h.reply("search", pattern="b*")["history"] == [(1, 3, "b = 2")]
    assert h.reply("sideways")["status"] == "error"


# ---- settings ----------------------------------------------------------------------------------

def test_settings_defaults_and_values() -> None:
    assert KernelSettings.from_env({}) == KernelSettings("chained", "default", None, 20)
    s = KernelSettings.from_env({"ZEROBOOT_MODE": "Isolated", "ZEROBOOT_TEMPLATE": "ml-1.0",
                                 "ZEROBOOT_CELL_TIMEOUT": "30", "ZEROBOOT_CHECKPOINTS": "5"})
    assert s == KernelSettings("isolated", "ml-1.0", 30.0, 5)
    assert KernelSettings.from_env({"ZEROBOOT_CELL_TIMEOUT": "0"}).cell_timeout is None


@pytest.mark.parametrize("env, name", [
    ({"ZEROBOOT_MODE": "sideways"}, "ZEROBOOT_MODE"),
    ({"ZEROBOOT_TEMPLATE": "../etc"}, "ZEROBOOT_TEMPLATE"),
    ({"ZEROBOOT_CELL_TIMEOUT": "-3"}, "ZEROBOOT_CELL_TIMEOUT"),
    ({"ZEROBOOT_CELL_TIMEOUT": "inf"}, "ZEROBOOT_CELL_TIMEOUT"),
    ({"ZEROBOOT_CHECKPOINTS": "many"}, "ZEROBOOT_CHECKPOINTS"),
])
def test_settings_errors_name_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(KernelConfigError, match=name):
        KernelSettings.from_env(env)


# ---- install -----------------------------------------------------------------------------------

def test_repository_kernelspecs() -> None:
    for name in KERNEL_NAMES:
        spec = json.loads((REPO / "kernelspec" / name / "kernel.json").read_text())
        assert spec["language"] == "python" and spec["interrupt_mode"] == "signal"
        assert spec["argv"][1:] == ["-m", "zeroboot_kernel.kernel_launch", "-f", "{connection_file}"]
        assert spec["env"]["ZEROBOOT_MODE"] == ("isolated" if name.endswith("isolated") else "chained")
        assert spec["display_name"].startswith("Python 3 (zeroboot VM")
        for size in (32, 64):
            png = (REPO / "kernelspec" / name / f"logo-{size}x{size}.png").read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
            assert int.from_bytes(png[16:20], "big") == size and int.from_bytes(png[20:24], "big") == size


def test_install_and_uninstall_into_a_prefix(tmp_path: Path) -> None:
    dest = Destination.choose(prefix=str(tmp_path))
    installed = install_kernelspecs(dest)
    assert sorted(Path(p).name for p in installed) == sorted(KERNEL_NAMES)
    for name in KERNEL_NAMES:
        spec = json.loads((tmp_path / "share/jupyter/kernels" / name / "kernel.json").read_text())
        assert spec["argv"][0] == sys.executable
        assert (tmp_path / "share/jupyter/kernels" / name / "logo-64x64.png").is_file()
    removed = uninstall_kernelspecs(dest)
    assert len(removed) == 2 and not any((tmp_path / "share/jupyter/kernels" / n).exists() for n in KERNEL_NAMES)


def test_install_location_flags_are_exclusive() -> None:
    with pytest.raises(InstallError, match="at most one"):
        Destination.choose(user=True, prefix="/tmp/x")


def test_cli_install_uninstall(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "zeroboot_kernel"]
    out = subprocess.run([*run, "install", "--prefix", str(tmp_path), "--no-template"], capture_output=True,
                         text=True, check=True).stdout
    assert "installed kernelspec zeroboot " in out and "zeroboot-isolated" in out
    listed = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"], capture_output=True,
                            text=True, check=True, env={"JUPYTER_PATH": str(tmp_path / "share/jupyter"),
                                                        "PATH": "/usr/bin:/bin"}).stdout
    assert set(KERNEL_NAMES) <= set(json.loads(listed)["kernelspecs"])
    out = subprocess.run([*run, "uninstall", "--prefix", str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    assert out.count("removed kernelspec") == 2
    help_text = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True).stdout
    for sub in ("run", "template", "install", "uninstall"):
        assert sub in help_text


# ---- the engine started before the kernel (kernel_launch.py, engine_owner.py) ----------------

def test_the_early_engine_goes_to_the_kernel_made_for_it(monkeypatch) -> None:
    import logging

    from zeroboot_kernel import engine_owner

    monkeypatch.setattr(engine_owner.EngineOwner, "run", lambda self: None)  # no engine process here
    settings = KernelSettings()
    engine_owner.start_early(settings, "/nb")
    owner = engine_owner.take_early(settings, "/nb")
    assert owner is not None and not owner.closing.is_set()
    owner.join()  # its engine failed at once, say: the kernel's start_once must not start it again
    owner.start_once()
    assert engine_owner.take_early(settings, "/nb") is None  # one kernel takes it, once
    # an engine that exited before the kernel adopted its owner is reported at adoption
    owner._exited("the sandbox engine process (pid 1) exited (exit status 1)")
    reasons: list[str] = []
    owner.adopt(logging.getLogger("test"), reasons.append)
    assert reasons == ["the sandbox engine process (pid 1) exited (exit status 1)"]
    owner._exited("again")
    assert reasons[-1] == "again"
    # started for other settings or another folder: not taken, and told to close
    engine_owner.start_early(settings, "/nb")
    other = engine_owner._early
    assert engine_owner.take_early(KernelSettings(mode="isolated"), "/nb") is None
    assert other is not None and other.closing.is_set()


# ---- the idle channel (what guest threads and tasks send between cells) -----------------------

def _idle_client(streams: list, comms: list) -> EngineClient:
    client = object.__new__(EngineClient)  # the reader's dispatch only: no engine process
    client.on_idle_stream = lambda name, text: streams.append((name, text))
    client.on_idle_comm = comms.append
    return client


def test_idle_channel_messages_are_checked_then_delivered() -> None:
    streams: list = []
    comms: list = []
    client = _idle_client(streams, comms)
    client._idle_delivery({"event": schema.IDLE_STREAM, "name": "stdout", "text": "tick\n"})()
    comm = {"kind": "comm_msg", "comm_id": "a" * 32, "data": {"method": "update", "state": {"value": 3}},
            "metadata": {}}
    client._idle_delivery({"event": schema.IDLE_COMM, "content": comm, "buffers": []})()
    assert streams == [("stdout", "tick\n")]
    assert [c["content"]["data"]["state"] for c in comms] == [{"value": 3}]
    client.on_idle_comm = None
    assert client._idle_delivery({"event": schema.IDLE_COMM, "content": comm, "buffers": []}) is None


@pytest.mark.parametrize("msg", [
    {"event": "idle_other"},
    {"event": "idle_comm", "content": {"kind": "comm_msg", "comm_id": "../x", "data": {}, "metadata": {}}},
    {"event": "idle_comm", "content": {"kind": "comm_open", "comm_id": "a" * 32, "data": {}, "metadata": {}},
     "buffers": []},  # an open without a target
    {"event": "idle_comm", "content": {"kind": "comm_msg", "comm_id": "a" * 32, "data": {}, "metadata": {}},
     "buffers": [1]},
    {"event": "idle_stream", "name": "stdin", "text": "x"},
])
def test_idle_channel_refuses_malformed_messages(msg: dict) -> None:
    with pytest.raises(schema.SchemaError):
        _idle_client([], [])._idle_delivery(msg)


def test_comm_messages_held_between_cells_are_bounded_newest_kept() -> None:
    """Without a live channel (batch runs) the engine holds what the guest sends between cells:
    a guest must not make it hold more than HELD_COMMS_BYTES of widget messages (16 MiB frames)."""
    from zeroboot_kernel import sandbox as sbx

    sb = sbx.Sandbox(None, None, False)  # type: ignore[arg-type]  # the held messages need no VM
    big = bytes(4 << 20)
    for i in range(10):
        sb._idle_comm({"kind": "comm_msg", "comm_id": "a" * 32, "data": {"i": i}, "metadata": {}, "buffers": [big]})
    assert sb._held_comms_bytes <= sbx.HELD_COMMS_BYTES
    given: list = []

    class Run:
        on_stream = None

        def message(self, msg_type: str, content: dict) -> None:
            given.append(content["data"]["i"])

    sb._give_held(Run())  # type: ignore[arg-type]
    assert given == [7, 8, 9] and sb._held_comms == [], given


@pytest.mark.parametrize("sent, kept", [
    ({"source": "ask_exit", "keepkernel": False}, {"source": "ask_exit", "keepkernel": False}),
    ({"source": "ask_exit", "keepkernel": True, "extra": "x" * 100}, {"source": "ask_exit", "keepkernel": True}),
    ({"source": "ask_exit", "keepkernel": "yes"}, {"source": "ask_exit", "keepkernel": False}),
    ({"source": "ask_exit"}, {"source": "ask_exit", "keepkernel": False}),
])
def test_the_exit_payload_keeps_only_a_real_keepkernel_flag(sent: dict, kept: dict) -> None:
    """The kernel acts on ask_exit (exit() in a cell ends it): only its one flag, a bool, passes."""
    assert schema.payloads({"payload": [sent, {"source": "unknown"}]}) == [kept]
