"""Session saves (zeroboot_kernel/session_save.py): save the live state, resume it in another
session or kernel, refuse saves of another template or that were damaged or forged, list them."""
from __future__ import annotations

import hashlib
import hmac
import struct
import time
from pathlib import Path

import pytest

from session_helpers import cell
from zeroboot_kernel import session_save as ss
from zeroboot_kernel.session import Session

KEY = bytes(range(32))


def save_file(s: Session, path: Path, key: bytes = KEY) -> bytes:
    data, _ = ss.capture(s, key, "test.ipynb")
    path.write_bytes(data)
    return data


def resign(data: bytes, key: bytes = KEY) -> bytes:
    """A save whose body was edited, with a valid HMAC again: what gets past the checksum."""
    body = data[:-ss.MAC_BYTES]
    return body + hmac.new(key, body, hashlib.sha256).digest()


def rebuild(data: bytes, manifest_edit=None, state=None, pages=None) -> bytes:
    """The save's parts edited and encoded again (signed with KEY)."""
    m = ss.read_manifest(data)
    manifest, st, pg = ss.decode(data, KEY, template_key=m["template_key"], state_format=m["state_format"],
                                 memory_size=m["memory_size"])
    if manifest_edit:
        manifest_edit(manifest)
    return ss.encode(manifest, st if state is None else state, pg if pages is None else pages, KEY)


@pytest.fixture(scope="module")
def saved(template, tmp_path_factory):
    """A session with variables, arrays, a frame, matplotlib state and /tmp files, saved."""
    s = Session(template)
    try:
        r = cell(s, "import numpy as np, pandas as pd, matplotlib\n"
                    "matplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                    "x = 41\nname = 'zeroboot'\narr = np.arange(1_000_000, dtype=np.float64) * 2\n"
                    "df = pd.DataFrame({'a': range(1000), 'b': [str(i) for i in range(1000)]})\n"
                    "plt.rcParams['lines.linewidth'] = 7.5\nfig = plt.figure(); plt.plot([1, 2, 3])\n"
                    "open('/tmp/note.txt', 'w').write('kept in the overlay')\n"
                    "fh = open('/tmp/open.txt', 'w+'); fh.write('still open'); fh.flush()\n"
                    "import os\npr, pw = os.pipe(); os.write(pw, b'piped')\n"
                    "import socket\nls = socket.socket(socket.AF_UNIX); ls.bind('/tmp/saved.sock'); ls.listen(1)\n"
                    "sc = socket.socket(socket.AF_UNIX); sc.connect('/tmp/saved.sock'); ss_, _ = ls.accept()\n"
                    "ls.close(); sc.send(b'queued')\n", 1)
        assert r["status"] == "ok", r
        path = tmp_path_factory.mktemp("saves") / "s1.zbsave"
        data = save_file(s, path)
    finally:
        s.close()
    return path, data


CHECK = ("(x, name, float(arr.sum()), df.shape, df['b'][999], plt.rcParams['lines.linewidth'], "
         "len(plt.get_fignums()), open('/tmp/note.txt').read(), fh.tell(), (fh.seek(0), fh.read())[1], os.read(pr, 5), "
         "sc.getpeername(), ss_.getsockname(), ss_.recv(10), os.path.exists('/tmp/saved.sock'))")
EXPECTED = ("(41, 'zeroboot', 999999000000.0, (1000, 2), '999', 7.5, 1, 'kept in the overlay', 10, 'still open', b'piped', "
            "'/tmp/saved.sock', '/tmp/saved.sock', b'queued', True)")


def test_resume_in_a_new_session_has_the_saved_state(template, saved) -> None:
    path, data = saved
    manifest = ss.read_manifest(data)
    assert manifest["template_key"] == template.manifest["key"] and manifest["pages"] > 0
    assert manifest["not_saved"] and manifest["notebook"] == "test.ipynb"
    s = Session(template)
    try:
        assert cell(s, "'x' in globals()", 1)["result"] == "False"
        ss.resume(s, str(path), KEY)
        assert " ".join(cell(s, CHECK, 2)["result"].split()) == EXPECTED
        # the resumed state goes on: cells, checkpoints and %rewind work from it
        cell(s, "x = 1", 3)
        s.prepare_next_cell()
        cell(s, "x = 2", 4)
        s.rewind(1)
        assert cell(s, "x", 5)["result"] == "1"
        # a reset returns to the resumed state (the clean state of this session now)
        s.restart()
        assert cell(s, "x", 6)["result"] == "41"
    finally:
        s.close()


def test_resume_replaces_state_and_checkpoints(template, saved) -> None:
    path, _ = saved
    s = Session(template)
    try:
        cell(s, "y = 5", 1)
        s.prepare_next_cell()
        cell(s, "y = 6", 2)
        assert s.checkpoints
        ss.resume(s, str(path), KEY)
        assert not s.checkpoints
        with pytest.raises(Exception, match="checkpoint"):  # %rewind history before the resume is gone
            s.rewind(1)
        assert cell(s, "('y' in globals(), x)", 3)["result"] == "(False, 41)"
    finally:
        s.close()


def test_the_save_holds_only_what_differs_from_the_template(template, saved) -> None:
    _, data = saved
    image = Path(template.directory) / "memory.img"
    assert len(data) < image.stat().st_blocks * 512  # far less than the template's own image


def resume_error(template, tmp_path: Path, data: bytes, key: bytes = KEY) -> str:
    path = tmp_path / "bad.zbsave"
    path.write_bytes(data)
    s = Session(template)
    try:
        cell(s, "z = 3", 1)
        with pytest.raises(ss.SaveError) as exc:
            ss.resume(s, str(path), key)
        assert cell(s, "z", 2)["result"] == "3"  # the session is untouched by a refused save
        return str(exc.value)
    finally:
        s.close()


def test_a_save_of_another_template_key_is_refused(template, saved, tmp_path) -> None:
    _, data = saved
    forged = rebuild(data, lambda m: m.update(template_key="0" * 64, template_name="other"))
    assert "template 'other'" in resume_error(template, tmp_path, forged)


def test_a_save_of_another_state_format_is_refused(template, saved, tmp_path) -> None:
    _, data = saved
    forged = rebuild(data, lambda m: m.update(state_format=m["state_format"] + 1))
    assert "state format" in resume_error(template, tmp_path, forged)


def test_a_save_of_another_users_key_is_refused(template, saved, tmp_path) -> None:
    _, data = saved
    assert "checksum" in resume_error(template, tmp_path, data, key=b"k" * 32)


@pytest.mark.parametrize("cut", [0, 5, 11, 200, 4096, -33, -1])
def test_a_truncated_save_is_refused(template, saved, tmp_path, cut) -> None:
    _, data = saved
    msg = resume_error(template, tmp_path, data[:cut] if cut else b"")
    assert "truncated" in msg or "checksum" in msg or "not a zeroboot" in msg


@pytest.mark.parametrize("where", [3, 10, 100, 0.3, 0.6, 0.9])
def test_a_bit_flipped_save_is_refused(template, saved, tmp_path, where) -> None:
    _, data = saved
    at = where if isinstance(where, int) else int(len(data) * where)
    flipped = bytearray(data)
    flipped[at] ^= 0x10
    assert resume_error(template, tmp_path, bytes(flipped))


def test_hostile_lengths_are_refused_even_with_a_valid_checksum(template, saved, tmp_path) -> None:
    _, data = saved
    n = struct.unpack_from("<I", data, 8)[0]
    blob = 12 + n  # the state blob's header: codec, raw length, stored length
    codec, raw_len, stored_len = struct.unpack_from("<BQQ", data, blob)
    for patch in (struct.pack("<BQQ", codec, raw_len - 1, stored_len),  # decompresses past what it says
                  struct.pack("<BQQ", codec, raw_len + 1, stored_len),
                  struct.pack("<BQQ", 1, 1 << 62, 100), struct.pack("<BQQ", 1, 100, 1 << 62),
                  struct.pack("<BQQ", 7, 100, 100), struct.pack("<BQQ", 0, 10, 20)):
        hostile = bytearray(data)
        hostile[blob:blob + 17] = patch
        assert "corrupt" in resume_error(template, tmp_path, resign(bytes(hostile)))
    huge_manifest = bytearray(data)
    huge_manifest[8:12] = struct.pack("<I", 0xFFFFFFF0)
    assert "corrupt" in resume_error(template, tmp_path, resign(bytes(huge_manifest)))


def test_a_deeply_nested_manifest_is_refused(template, tmp_path) -> None:
    head = b"[" * 200_000 + b"]" * 200_000
    data = ss.MAGIC + struct.pack("<I", len(head)) + head + bytes(100)
    with pytest.raises(ss.SaveError, match="corrupt"):
        ss.read_manifest(data)
    assert "corrupt" in resume_error(template, tmp_path, resign(data + bytes(ss.MAC_BYTES)))


def test_hostile_pages_and_state_are_refused_by_the_validators(template, saved, tmp_path) -> None:
    _, data = saved
    size = ss.read_manifest(data)["memory_size"]
    for pages in (struct.pack("<Q", (size // 4096) << 1 | 1),          # a page past guest memory
                  struct.pack("<QQ", 5 << 1 | 1, 5 << 1 | 1),           # the same page twice
                  struct.pack("<Q", 7 << 1) + b"x" * 100,               # a partial page
                  b"\x01\x02\x03"):                                    # a partial record
        assert "corrupt" in resume_error(template, tmp_path, rebuild(data, pages=pages))
    _, state, _ = ss.decode(data, KEY, template_key=template.manifest["key"],
                            state_format=ss.read_manifest(data)["state_format"], memory_size=size)
    assert b"MEM " in state
    for bad_state in (state[:len(state) // 2], state.replace(b"MEM ", b"MEX ", 1), state + b"\0", b""):
        msg = resume_error(template, tmp_path, rebuild(data, state=bad_state))
        assert "state.bin" in msg or "snapshot" in msg


def test_list_saves(tmp_path, saved, monkeypatch) -> None:
    path, data = saved
    monkeypatch.setenv("ZEROBOOT_SAVE_DIR", str(tmp_path))
    (tmp_path / "first.zbsave").write_bytes(data)
    (tmp_path / "junk.zbsave").write_bytes(b"not a save")
    rows = {s.name: s for s in ss.list_saves()}
    assert rows["first"].size == len(data) and rows["first"].template == ss.read_manifest(data)["template_name"]
    assert "unreadable" in rows["junk"].template
    text = ss.format_saves(list(rows.values()), now=time.time() + 7200)
    assert "first" in text and "2.0 h" in text and "MiB" in text


def test_save_names_and_paths(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ZEROBOOT_SAVE_DIR", str(tmp_path))
    assert ss.resolve("mine") == tmp_path / "mine.zbsave"
    assert ss.resolve("./x/y.zbsave").is_absolute()
    for bad in ("..", ".hidden", "a b", ""):
        with pytest.raises(ss.SaveError):
            ss.resolve(bad)
    key = ss.save_key()
    assert ss.save_key() == key and (tmp_path / ss.KEY_FILE).stat().st_mode & 0o777 == 0o600


# ---- through the kernel: magics, a kernel restart, ZEROBOOT_RESUME, autosave ------------------

def test_save_restart_the_kernel_and_resume(tmp_path) -> None:
    from kernel_helpers import execute, kernel, stream_text, value_of
    env = {"ZEROBOOT_SAVE_DIR": str(tmp_path)}
    with kernel(**env) as (_, kc):
        reply, _ = execute(kc, "import numpy as np\nv = np.arange(10) * 3\nopen('/tmp/k.txt', 'w').write('hi')\n"
                               "open('zb_save_probe.txt', 'w').write('in the overlay')")
        assert reply["status"] == "ok"
        reply, msgs = execute(kc, "%sandbox save mine")
        assert reply["status"] == "ok" and "saved the session" in stream_text(msgs), msgs
        reply, msgs = execute(kc, "%sandbox saves")
        assert "mine" in stream_text(msgs) and "MiB" in stream_text(msgs)
    assert (tmp_path / "mine.zbsave").is_file()
    with kernel(**env) as (_, kc):  # a new kernel process: a fresh session until the resume
        assert value_of(kc, "'v' in globals()") == "False"
        reply, msgs = execute(kc, "%sandbox resume mine")
        assert reply["status"] == "ok" and "resumed the session" in stream_text(msgs), msgs
        assert value_of(kc, "(int(v.sum()), open('/tmp/k.txt').read(), open('zb_save_probe.txt').read())") == \
            "(135, 'hi', 'in the overlay')"
        assert not Path("zb_save_probe.txt").exists()  # the notebook folder's overlay, never the host
        reply, _ = execute(kc, "%sandbox resume nosuch")
        assert reply["status"] == "error" and "no save" in reply["evalue"]
    with kernel(ZEROBOOT_RESUME="mine", **env) as (_, kc):
        reply, msgs = execute(kc, "int(v.sum())")
        assert reply["status"] == "ok" and "135" in str(msgs) and "resumed the session" in stream_text(msgs, "stderr")


def test_autosave_on_shutdown_and_resume_at_the_next_start(tmp_path) -> None:
    from kernel_helpers import execute, kernel, value_of
    env = {"ZEROBOOT_SAVE_DIR": str(tmp_path), "ZEROBOOT_AUTOSAVE": "on"}
    with kernel(**env) as (_, kc):
        assert execute(kc, "w = 'before the culler'")[0]["status"] == "ok"
    # leaving kernel() sent a shutdown_request, as JupyterHub's culler does
    saves = list(tmp_path.glob("autosave-*.zbsave"))
    assert len(saves) == 1
    with kernel(**env) as (_, kc):
        assert value_of(kc, "w") == "'before the culler'"


def test_an_autosave_refused_for_live_children_sets_the_older_one_aside(tmp_path) -> None:
    """A session that cannot be saved (a child process lives) must not leave an older autosave to be
    resumed as if it were its last state: that one is renamed, and the next kernel starts fresh."""
    from kernel_helpers import execute, kernel, stream_text, value_of
    env = {"ZEROBOOT_SAVE_DIR": str(tmp_path), "ZEROBOOT_AUTOSAVE": "on"}
    with kernel(**env) as (_, kc):
        assert execute(kc, "w = 'first session'")[0]["status"] == "ok"
    assert len(list(tmp_path.glob("autosave-*.zbsave"))) == 1
    with kernel(**env) as (_, kc):
        assert value_of(kc, "w") == "'first session'"
        reply, _ = execute(kc, "w = 'second session'\nimport subprocess\np = subprocess.Popen(['sleep', '600'])")
        assert reply["status"] == "ok"
    saves = sorted(p.name for p in tmp_path.glob("autosave-*.zbsave"))
    assert len(saves) == 1 and "-outdated-" in saves[0], saves
    with kernel(**env) as (_, kc):
        assert value_of(kc, "'w' in globals()") == "False"
        reply, msgs = execute(kc, "%sandbox saves")
        assert "-outdated-" in stream_text(msgs)
