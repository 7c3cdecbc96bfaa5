"""The reproducers of issue 11 that go through the real kernel (the host's Python side): each
was a way for cell code to write host files outside the notebook's folder, to desynchronise the
kernel from its engine, or to kill the engine. Each test here failed on the code before the fix.

The kernels run with the notebook folder `nb` inside a temporary directory; anything that lands
in that directory beside `nb` is a write outside the folder."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernel_helpers import execute, kernel, plain, stream_text

FRAME_HELPER = textwrap.dedent("""\
    import json, os, struct
    def _zb_frame(ftype, payload):
        body = json.dumps(payload).encode()
        return struct.pack("<IHHI", 0x5A42464D, 1, ftype, len(body)) + body
    def _zb_write(ftype, payload):
        fd = os.open("/dev/ttyS0", os.O_WRONLY)
        try:
            if isinstance(payload, bytes):  # a payload written by hand
                os.write(fd, struct.pack("<IHHI", 0x5A42464D, 1, ftype, len(payload)) + payload)
            else:
                os.write(fd, _zb_frame(ftype, payload))
        finally:
            os.close(fd)
    """)


@pytest.fixture
def notebook_dir(tmp_path: Path, monkeypatch) -> Path:
    nb = tmp_path / "nb"
    nb.mkdir()
    monkeypatch.chdir(nb)
    return nb


def outside_files(nb: Path) -> list[str]:
    return sorted(p.name for p in nb.parent.iterdir() if p.name != "nb")


def text_of(msgs) -> str:
    return plain(stream_text(msgs) + stream_text(msgs, "stderr"))


def test_export_follows_no_forged_listing_lines_and_no_guest_symlinks(notebook_dir):
    """Item 1: names holding newlines forged listing lines ('d\\t..'), export walked into a guest
    symlink and up its '..' chain, and wrote beside the notebook's folder."""
    setup = textwrap.dedent("""\
        import os
        d = "/tmp/c"
        os.makedirs(d, exist_ok=True)
        open(d + "/pwned.txt", "w").write("pwned")
        for name in ["\\nA", "\\nB", "\\nC"]:
            d = d + "/" + name
            os.mkdir(d)
            open(d + "/\\nd\\t..", "w").write("x")
        os.makedirs("out", exist_ok=True)
        os.symlink(d, "out/S")
        open("out/\\nd\\tS", "w").write("x")
        open("out/plain.txt", "w").write("kept")
        """)
    with kernel("zeroboot") as (km, kc):
        reply, msgs = execute(kc, setup)
        assert reply["status"] == "ok", reply
        reply, msgs = execute(kc, "%sandbox export out")
        assert reply["status"] == "ok", reply
        out = text_of(msgs)
        reply, msgs = execute(kc, "%sandbox diff")
        diff = text_of(msgs)
    assert outside_files(notebook_dir) == [], outside_files(notebook_dir)
    assert sorted(p.name for p in (notebook_dir / "out").iterdir()) == ["plain.txt"]
    assert "out/S (symlink)" in out and "control characters" in out
    assert "\\nd\\tS" in diff and "\n  A out/\n" not in diff  # the newline is shown escaped


def test_a_forged_reply_cannot_choose_host_paths(notebook_dir):
    """Item 2: a RESULT frame whose data is a list made the kernel abandon the cell; the cell's
    forged DONE (with the request id found by gc) then became the reply of the next request,
    `%sandbox export`, which took the host root and file names from it."""
    root = str(notebook_dir.parent)
    cell = FRAME_HELPER + textwrap.dedent(f"""\
        import base64, gc
        # MARKER-forged-reply
        req = next(o for o in gc.get_objects()
                   if isinstance(o, dict) and "MARKER-forged-reply" in str(o.get("code", "")) and "silent" in o)
        _zb_write(103, {{"data": [1], "metadata": {{}}, "execution_count": 1}})
        _zb_write(107, {{"id": req["id"], "status": "ok", "execution_count": 1, "user_expressions": {{}},
                        "payload": [], "root": {root!r},
                        "items": [{{"rel": "../pwned2.txt", "dir": False,
                                    "data": base64.b64encode(b"pwned").decode()}}]}})
        print("cell went on")
        """)
    with kernel("zeroboot") as (km, kc):
        first, _ = execute(kc, cell)
        # "nb" exists beside the forged root: the old kernel wrote <root>/nb/../pwned2.txt
        export_reply, _ = execute(kc, "%sandbox export nb")
        last, msgs = execute(kc, "print('next cell')")
    assert outside_files(notebook_dir) == []
    assert first["status"] == "error" and "RESULT" in first["evalue"], first
    assert export_reply["status"] == "error" and "does not exist" in export_reply["evalue"], export_reply
    assert last["status"] == "ok" and text_of(msgs) == "next cell\n"  # no output of another cell


def test_a_forged_done_frame_carries_no_extra_fields_to_the_kernel(notebook_dir):
    """Item 2: a forged DONE ends the cell. Without the agent's frame number (the channel's
    self-check) it is found out and the cell is an error, rolled back; either way no field
    beyond an execute_reply's passes, and nothing of it reaches a later request."""
    cell = FRAME_HELPER + textwrap.dedent("""\
        import gc
        # MARKER-forged-done
        req = next(o for o in gc.get_objects()
                   if isinstance(o, dict) and "MARKER-forged-done" in str(o.get("code", "")) and "silent" in o)
        _zb_write(107, {"id": req["id"], "status": "ok", "execution_count": 1, "user_expressions": {},
                        "payload": [{"source": "ask_exit", "keepkernel": False}], "root": "/", "items": []})
        """)
    with kernel("zeroboot") as (km, kc):
        reply, msgs = execute(kc, cell)
        assert reply["status"] == "error" and "channel" in reply["evalue"], reply
        assert "root" not in reply and "items" not in reply and reply["payload"] == []
        reply, msgs = execute(kc, "print(1 + 1)")
        assert reply["status"] == "ok" and text_of(msgs) == "2\n"


@pytest.mark.parametrize("payload", [
    '{"data": [1]}', '{"data": {"text/plain": 1}}', '{"data": {"not a mime": "x"}}', '{"metadata": []}',
    '{"transient": {"display_id": 5}}',
])
def test_malformed_display_frames_are_an_error_of_the_cell(notebook_dir, payload):
    with kernel("zeroboot") as (km, kc):
        reply, msgs = execute(kc, FRAME_HELPER + f"_zb_write(102, {payload})\nprint('after')")
        assert reply["status"] == "error" and "DISPLAY" in reply["evalue"], reply
        reply, msgs = execute(kc, "print('next')")
        assert reply["status"] == "ok" and text_of(msgs) == "next\n"


def test_deeply_nested_display_data_does_not_kill_the_engine(notebook_dir):
    """Item 4b: JSON nested ~980 deep made engine_wire.send raise RecursionError, and the engine
    server (which caught only ZerobootError) exited."""
    cell = FRAME_HELPER + textwrap.dedent("""\
        deep = "[" * 980 + "1" + "]" * 980
        _zb_write(102, ('{"data": {"application/json": ' + deep + '}, "metadata": {}}').encode())
        """)
    with kernel("zeroboot") as (km, kc):
        reply, msgs = execute(kc, "x = 41")
        reply, msgs = execute(kc, cell)
        assert reply["status"] == "error" and "deep" in reply["evalue"], reply
        reply, msgs = execute(kc, "print(x + 1)")
        assert reply["status"] == "ok" and text_of(msgs) == "42\n"


def test_diff_of_a_very_deep_tree_does_not_kill_the_engine(notebook_dir):
    """Item 4c: a recursive diff_dir on a 2,038-deep tree overflowed the engine's C stack."""
    cell = textwrap.dedent("""\
        import os
        top = os.getcwd()
        for _ in range((4000 - len(top)) // 2):  # as deep as PATH_MAX lets the cwd go (2,038 from /root)
            os.mkdir("d")
            os.chdir("d")
        os.chdir(top)
        """)
    with kernel("zeroboot") as (km, kc):
        reply, msgs = execute(kc, cell, timeout=180)
        assert reply["status"] == "ok", reply
        reply, msgs = execute(kc, "%sandbox diff", timeout=120)
        assert reply["status"] == "ok", reply
        out = text_of(msgs)
        assert "A d   (created)" in out and "nested too deep" in out
        assert out.count("\n") < 300  # ZB_DIFF_MAX_DEPTH lines, then one for what is deeper
        reply, msgs = execute(kc, "print('alive')")
        assert reply["status"] == "ok" and text_of(msgs) == "alive\n"


def test_exports_stream_large_files_and_refuse_huge_ones_before_reading(notebook_dir):
    """Item 4d: a 300 MiB sparse file made one message too large for the engine channel ("oversized
    message", the kernel stopped); a 1 TiB one would exhaust the engine's memory (read whole)."""
    with kernel("zeroboot") as (km, kc):
        reply, msgs = execute(kc, "import os\nos.makedirs('sp', exist_ok=True)\n"
                                  "open('sp/big.bin', 'wb').truncate(300 << 20)\n"
                                  "os.makedirs('/tmp/huge', exist_ok=True)\n"
                                  "open('/tmp/huge/tera.bin', 'wb').truncate(1 << 40)")
        assert reply["status"] == "ok", reply
        reply, msgs = execute(kc, "%sandbox export sp", timeout=300)
        assert reply["status"] == "ok", reply
        reply, msgs = execute(kc, "%sandbox export /tmp/huge")
        assert reply["status"] == "error" and "GiB" in reply["evalue"], reply
        reply, msgs = execute(kc, "print('alive')")
        assert reply["status"] == "ok" and text_of(msgs) == "alive\n"
    big = notebook_dir / "sp" / "big.bin"
    assert big.stat().st_size == 300 << 20
    assert not (notebook_dir / "huge").exists()


HOSTILE_HTML = ('<b onmouseover="alert(1)">bold</b><script>alert(2)</script>'
                '<a href="javascript:alert(3)">link</a><img src=x onerror="alert(4)">')


def _bundles(msgs) -> list[dict]:
    return [m["content"]["data"] for m in msgs if m["msg_type"] in ("display_data", "execute_result")]


def test_safe_outputs_drop_script_and_sanitise_html(notebook_dir):
    """Item 9: with outputs safe (the isolated kernelspec's default), no JavaScript reaches the
    frontend; `%sandbox outputs` switches a chained kernel."""
    cell = textwrap.dedent(f"""\
        from IPython.display import display, HTML, Javascript, Markdown
        display(HTML({HOSTILE_HTML!r}))
        display(Javascript("alert(5)"))
        display(Markdown("[x](javascript:alert(6)) <img src=y onerror=alert(7)>"))
        """)

    def check(bundles: list[dict]) -> None:
        text = repr(bundles)
        assert "application/javascript" not in text and "alert" not in text and "javascript:" not in text
        assert "<b>bold</b>" in bundles[0]["text/html"]

    with kernel("zeroboot-isolated") as (km, kc):
        reply, msgs = execute(kc, cell)
        assert reply["status"] == "ok", reply
        check(_bundles(msgs))
    with kernel("zeroboot") as (km, kc):
        reply, msgs = execute(kc, cell)
        assert any("application/javascript" in b for b in _bundles(msgs))  # trusted: as ipykernel
        reply, msgs = execute(kc, "%sandbox outputs safe")
        assert reply["status"] == "ok" and "safe" in text_of(msgs)
        reply, msgs = execute(kc, cell)
        check(_bundles(msgs))
