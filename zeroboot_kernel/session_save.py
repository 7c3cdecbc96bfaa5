"""Session saves: the live sandbox state written to one file, resumed after a kernel restart.

A save holds only what differs from the template the session was forked from: the engine's state
(state.bin's bytes, zb_snapshot_save_delta) and the guest pages that are not the template's
(zero pages as an index only), each compressed with zstd when that pays. Resuming rebuilds a
memory image (a memfd: the template's memory.img with the saved pages written over it) and loads
the state over it (zb_snapshot_load_bytes, which validates it like a template's state.bin).

File layout (all integers little-endian):

    MAGIC (8 bytes) | u32 manifest length | manifest (JSON)
    | u8 state codec | u64 state raw length | u64 state stored length | state bytes
    | u8 pages codec | u64 pages raw length | u64 pages stored length | page records
    | HMAC-SHA256 (32 bytes) of everything before it

A save is an untrusted file when it is loaded: every length is checked against the file and a
bound before anything is read or decompressed (decompression is bounded by the raw length), then
the HMAC (a key of the user's, in the saves folder, created 0600) proves this user's kernel wrote
it (the state names the host folder the sandbox shows: a forged save must not choose it); the
manifest must name this template key and state format; the page records are checked (in-range,
increasing indices, whole pages) and the state is validated by the engine's own loader.

The locked-down engine process creates no host files: it builds the save in memory and the kernel
fetches it in chunks and writes it (like %sandbox export); to resume, the engine opens the file the
kernel names read-only. The path always comes from the kernel's side (the user's magic or
environment), never from anything the guest sends.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import os
import re
import secrets
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ZerobootError

log = logging.getLogger("zeroboot_kernel.session_save")

MAGIC = b"ZBSAVE\x01\n"
FORMAT = 1
PAGE = 4096
MAC_BYTES = 32
MAX_MANIFEST = 1 << 20
MAX_STATE = 2 << 30          # as STATE_MAX_BYTES in native/snapshot_file.c
MAX_MEMORY = 1 << 40         # guest memory sizes the engine accepts are far below this
CODEC_RAW, CODEC_ZLIB, CODEC_ZSTD = 0, 1, 2  # written: raw or zstd; zlib is read too
SUFFIX = ".zbsave"
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,100}")
KEY_FILE = ".save-key"
# What a save cannot hold, and how the resumed session sees it (docs/COMPATIBILITY.md). Pipes and
# socketpairs are in-memory files: they are saved with their buffered bytes. A guest network
# connection (none exist on this build: socket() is EACCES) must be added here when one can exist.
NOT_SAVED = [
    "%rewind checkpoints: %rewind history from before the resume is gone; it starts again from the resumed state",
    "files of the notebook's folder on the host: read again from the host at resume (the sandbox's own "
    "changes there, in the overlay, are saved); a file the session had open that is gone on the host makes "
    "the resume fail with an error naming it",
    "open network connections (ZEROBOOT_NETWORK): a socket of the save has no host connection; in the resumed "
    "session it reads as reset by peer (ConnectionResetError, BrokenPipeError on send): open a new one",
    "child processes: a session with live child processes (a Popen, `!cmd &`) is not saved: the save is refused "
    "with their pids (wait for them or end them first); an autosave refused so keeps the older autosave aside "
    "(NAME-outdated-DATE in %sandbox saves) and the next kernel starts fresh",
    "widgets' frontend side: %sandbox resume resynchronises the page as a %rewind does (comm_close for widgets "
    "the save lacks); in a kernel started with ZEROBOOT_RESUME or autosave, display the widgets again",
]


class SaveError(ZerobootError):
    """A save could not be written, or a file is not a save this kernel can resume."""


# ---- the file ---------------------------------------------------------------------------------

def _pack_blob(data: bytes) -> bytes:
    """A codec byte, the raw and stored lengths, the stored bytes: zstd (level 1: ~250 MB/s here,
    zlib's fastest level ~35 MB/s, for the same size) when it saves a tenth."""
    import zstandard  # here, not at the top: ~0.8 MiB that an engine that never saves does not pay

    packed = zstandard.ZstdCompressor(level=1).compress(data)
    if len(packed) < len(data) * 0.9:
        return struct.pack("<BQQ", CODEC_ZSTD, len(data), len(packed)) + packed
    return struct.pack("<BQQ", CODEC_RAW, len(data), len(data)) + data


def encode(manifest: dict[str, Any], state: bytes, pages: bytes, key: bytes) -> bytes:
    head = json.dumps(manifest, sort_keys=True).encode()
    if len(head) > MAX_MANIFEST:
        raise SaveError("the save's manifest is too large")
    body = MAGIC + struct.pack("<I", len(head)) + head + _pack_blob(state) + _pack_blob(pages)
    return body + hmac.new(key, body, hashlib.sha256).digest()


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise SaveError(f"the save file is truncated or corrupt (at its {what})")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))


def _unpack_blob(r: _Reader, what: str, max_raw: int) -> bytes:
    codec, raw_len, stored_len = r.unpack("<BQQ", what)
    if codec not in (CODEC_RAW, CODEC_ZLIB, CODEC_ZSTD) or raw_len > max_raw or stored_len > len(r.data) - r.pos:
        raise SaveError(f"the save file is corrupt (the {what}'s header: codec {codec}, {raw_len} bytes)")
    stored = r.take(stored_len, what)
    if codec == CODEC_RAW:
        if raw_len != stored_len:
            raise SaveError(f"the save file is corrupt (the {what}'s lengths disagree)")
        return bytes(stored)
    if codec == CODEC_ZSTD:
        import zstandard  # see _pack_blob

        try:  # a bounded read: never more than the raw length says, whatever the frame claims
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored)) as reader:
                out = reader.read(raw_len + 1)
                extra = reader.read(1) if len(out) == raw_len else b""
        except zstandard.ZstdError as exc:
            raise SaveError(f"the save file is corrupt (the {what} does not decompress: {exc})") from None
        if len(out) != raw_len or extra:
            raise SaveError(f"the save file is corrupt (the {what} decompresses to another length)")
        return out
    d = zlib.decompressobj()
    try:
        out = d.decompress(stored, raw_len + 1)  # bounded: never more than the raw length says
    except zlib.error as exc:
        raise SaveError(f"the save file is corrupt (the {what} does not decompress: {exc})") from None
    if len(out) != raw_len or not d.eof or d.unconsumed_tail:
        raise SaveError(f"the save file is corrupt (the {what} decompresses to another length)")
    return out


def read_manifest(data: bytes | memoryview) -> dict[str, Any]:
    """The manifest of a save file's bytes (its structure checked, not its HMAC)."""
    r = _Reader(data)
    if bytes(r.take(len(MAGIC), "magic")) != MAGIC:
        raise SaveError("this is not a zeroboot session save (wrong magic)")
    (n,) = r.unpack("<I", "manifest length")
    if n > MAX_MANIFEST:
        raise SaveError(f"the save file is corrupt (a manifest of {n} bytes)")
    try:
        manifest = json.loads(bytes(r.take(n, "manifest")))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # nesting deeper than json's limit
        raise SaveError(f"the save file is corrupt (its manifest: {str(exc)[:200]})") from None
    if not isinstance(manifest, dict):
        raise SaveError("the save file is corrupt (its manifest is not an object)")
    return manifest


def decode(data: bytes, key: bytes, *, template_key: str, state_format: int,
           memory_size: int) -> tuple[dict[str, Any], bytes, bytes]:
    """(manifest, state, page records) of a save, or SaveError saying what is wrong with it."""
    if len(data) < len(MAGIC) + 4 + MAC_BYTES:
        raise SaveError("the save file is truncated (shorter than its header)")
    body, mac = memoryview(data)[:-MAC_BYTES], data[-MAC_BYTES:]
    manifest = read_manifest(body)
    if manifest.get("format") != FORMAT:
        raise SaveError(f"the save is in save format {manifest.get('format')!r}; this kernel reads format {FORMAT}")
    if not hmac.compare_digest(hmac.new(key, body, hashlib.sha256).digest(), mac):
        raise SaveError("the save file was changed or truncated since it was written, or was written by another "
                        "user's kernel (its checksum does not match): it cannot be resumed")
    if manifest.get("state_format") != state_format:
        raise SaveError(f"the save was written by an engine with state format {manifest.get('state_format')!r} and this "
                        f"engine reads format {state_format}: resume it with the zeroboot-kernel version that saved it")
    if manifest.get("template_key") != template_key:
        raise SaveError(f"the save needs the template {manifest.get('template_name')!r} with key "
                        f"{str(manifest.get('template_key'))[:16]}, and this kernel runs key {template_key[:16]} (another "
                        f"template, Python environment, memory size or engine build): it cannot be resumed here")
    if manifest.get("memory_size") != memory_size:
        raise SaveError("the save's memory size is not the template's")
    r = _Reader(body)
    (n,) = struct.unpack_from("<I", body, len(MAGIC))
    r.pos = len(MAGIC) + 4 + n
    state = _unpack_blob(r, "state", MAX_STATE)
    pages = _unpack_blob(r, "pages", (memory_size // PAGE) * (8 + PAGE))
    if r.pos != len(body):
        raise SaveError("the save file is corrupt (bytes after its pages)")
    return manifest, state, pages


def page_records(pages: bytes, memory_size: int) -> list[tuple[int, int]]:
    """The (page index, offset of its data in pages or -1 for a zero page) of the page records:
    every index within guest memory, strictly increasing, every page whole."""
    npages = memory_size // PAGE
    out: list[tuple[int, int]] = []
    pos, last = 0, -1
    while pos < len(pages):
        if pos + 8 > len(pages):
            raise SaveError("the save file is corrupt (a truncated page record)")
        (word,) = struct.unpack_from("<Q", pages, pos)
        pos += 8
        index, zero = word >> 1, word & 1
        if index >= npages or index <= last:
            raise SaveError(f"the save file is corrupt (page record {len(out)}: page {index} of {npages})")
        last = index
        if zero:
            out.append((index, -1))
            continue
        if pos + PAGE > len(pages):
            raise SaveError("the save file is corrupt (a truncated page)")
        out.append((index, pos))
        pos += PAGE
    return out


def build_image(template_image: str, memory_size: int, pages: bytes) -> int:
    """A memfd holding the template's memory image with the saved pages written over it."""
    records = page_records(pages, memory_size)
    fd = os.memfd_create("zeroboot-resume", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, memory_size)
        src = os.open(template_image, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(src).st_size != memory_size:
                raise SaveError("the template's memory image has another size than the save")
            off = _seek(src, 0, os.SEEK_DATA, memory_size)
            while off < memory_size:  # the image's data regions; its holes stay holes
                hole = _seek(src, off, os.SEEK_HOLE, memory_size)
                while off < hole:
                    block = os.pread(src, min(1 << 20, hole - off), off)
                    if not block:
                        raise SaveError("the template's memory image is shorter than it says")
                    os.pwrite(fd, block, off)
                    off += len(block)
                off = _seek(src, hole, os.SEEK_DATA, memory_size)
        finally:
            os.close(src)
        zero = bytes(PAGE)
        view = memoryview(pages)
        for index, at in records:
            os.pwrite(fd, zero if at < 0 else view[at:at + PAGE], index * PAGE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _seek(fd: int, off: int, whence: int, end: int) -> int:
    try:
        return os.lseek(fd, off, whence)
    except OSError:  # ENXIO: no data after off
        return end


# ---- where saves live (the kernel's side) -----------------------------------------------------

def save_root() -> Path:
    """$ZEROBOOT_SAVE_DIR, else $XDG_DATA_HOME/zeroboot-kernel/saves."""
    env = os.environ.get("ZEROBOOT_SAVE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "zeroboot-kernel" / "saves"


def save_key(root: Path | None = None) -> bytes:
    """The user's key that signs saves (created on first use, readable by the user only)."""
    root = root or save_root()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = root / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) != 32:
            raise SaveError(f"{path} is not a save key (32 bytes): remove it (existing saves then cannot be resumed)")
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def resolve(name_or_path: str, root: Path | None = None) -> Path:
    """A save's file: NAME is root/NAME.zbsave; anything with a '/' (or ending in .zbsave) is a path
    of the user's choosing, relative to the kernel's working directory."""
    root = root or save_root()
    if "/" in name_or_path or name_or_path.endswith(SUFFIX):
        return Path(os.path.abspath(os.path.expanduser(name_or_path)))
    if not NAME_RE.fullmatch(name_or_path) or name_or_path.startswith("."):
        raise SaveError(f"bad save name {name_or_path!r}: use letters, digits, '_', '-' and '.', or a path with a '/'")
    return root / f"{name_or_path}{SUFFIX}"


def default_name() -> str:
    return time.strftime("save-%Y%m%d-%H%M%S")


def notebook_id(notebook_dir: str) -> str:
    """What identifies the notebook for autosave: Jupyter's JPY_SESSION_NAME (the notebook's path,
    which jupyter_server gives the kernels it starts), else the kernel's working directory."""
    return os.environ.get("JPY_SESSION_NAME") or os.path.realpath(notebook_dir)


def autosave_name(notebook: str) -> str:
    return "autosave-" + hashlib.sha256(notebook.encode()).hexdigest()[:16]


def set_aside(path: Path) -> Path | None:
    """Rename an outdated save (an autosave whose successor failed) to NAME-outdated-DATE, so that
    it is not resumed by itself; the new path, or None if there was none (or it cannot move)."""
    if not path.is_file():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    target = path.with_name(f"{path.name[:-len(SUFFIX)]}-outdated-{stamp}{SUFFIX}")
    try:
        os.replace(path, target)
    except OSError as exc:
        log.error("zeroboot: cannot set the outdated save %s aside: %s", path, exc.strerror)
        return None
    return target


def write_file(path: Path, chunks: Any) -> int:
    """Write the chunks to path atomically (a temporary file renamed over it); the size written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    size = 0
    try:
        with open(tmp, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            for chunk in chunks:
                f.write(chunk)
                size += len(chunk)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size


@dataclass
class SaveInfo:
    name: str
    path: Path
    size: int
    created: float
    template: str
    notebook: str


def list_saves(root: Path | None = None) -> list[SaveInfo]:
    root = root or save_root()
    out = []
    for path in sorted(root.glob(f"*{SUFFIX}")) if root.is_dir() else []:
        try:
            with open(path, "rb") as f:
                manifest = read_manifest(f.read(len(MAGIC) + 4 + MAX_MANIFEST))
            out.append(SaveInfo(path.name[:-len(SUFFIX)], path, path.stat().st_size, float(manifest.get("created", 0)),
                                str(manifest.get("template_name", "?")), str(manifest.get("notebook", ""))))
        except (OSError, SaveError, ValueError, TypeError) as exc:
            out.append(SaveInfo(path.name[:-len(SUFFIX)], path, 0, 0.0, f"(unreadable: {exc})", ""))
    return out


def format_saves(saves: list[SaveInfo], now: float | None = None) -> str:
    if not saves:
        return f"no saves in {save_root()} (`%sandbox save [NAME]` makes one)"
    now = now or time.time()
    lines = [f"saves in {save_root()}:"]
    for s in saves:
        age = max(0.0, now - s.created)
        age_text = f"{age / 86400:.1f} d" if age > 86400 else f"{age / 3600:.1f} h" if age > 3600 else f"{age / 60:.0f} min"
        lines.append(f"  {s.name:<32} {s.size / 1048576:9.1f} MiB  {age_text:>8} old  template {s.template}")
    return "\n".join(lines)


# ---- the engine's side: capture and resume a Session ------------------------------------------

def _read_fd(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts, off = [], 0
    while off < size:
        block = os.pread(fd, min(1 << 24, size - off), off)
        if not block:
            break
        parts.append(block)
        off += len(block)
    return b"".join(parts)


def memory_size(session: Any) -> int:
    return os.stat(Path(session.template.directory) / "memory.img").st_size


def capture(session: Any, key: bytes, notebook: str, snap: Any = None) -> tuple[bytes, dict[str, Any]]:
    """The save file's bytes of the session's current state (or of snap, a snapshot of a fork of
    it, which stays the caller's), and its manifest."""
    from .template import state_format
    t0 = time.perf_counter()
    snap, owned = session.snapshot_for_save() if snap is None else (snap, False)
    state_fd = os.memfd_create("zeroboot-save-state", os.MFD_CLOEXEC)
    pages_fd = os.memfd_create("zeroboot-save-pages", os.MFD_CLOEXEC)
    try:
        snap.save_delta(state_fd, pages_fd)
        state, pages = _read_fd(state_fd), _read_fd(pages_fd)
    finally:
        os.close(state_fd)
        os.close(pages_fd)
        if owned:
            snap.release()
    records = page_records(pages, memory_size(session))
    manifest = {
        "format": FORMAT,
        "template_key": session.template.manifest.get("key"),
        "template_name": session.template.name,
        "state_format": state_format(),
        "zeroboot": session.template.manifest.get("zeroboot"),
        "memory_size": memory_size(session),
        "created": time.time(),
        "notebook": notebook,
        "project_root": session.project_root,
        "project_dir": session.project_dir,
        "files": session.files,
        "mode": session.mode,
        "pages": len(records),
        "zero_pages": sum(1 for _, at in records if at < 0),
        "not_saved": NOT_SAVED,
    }
    data = encode(manifest, state, pages, key)
    log.info("session save: %d pages, %d bytes in %.3f s", len(records), len(data), time.perf_counter() - t0)
    return data, manifest


def read_save_file(path: str, limit: int) -> bytes:
    """The bytes of a save file, opened read-only (the engine may create no host files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SaveError(f"cannot open the save {path}: {exc.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise SaveError(f"{path} is larger than any save of this template can be ({size} bytes)")
        data = _read_fd(fd)
    finally:
        os.close(fd)
    if len(data) != size:
        raise SaveError(f"cannot read all of {path}")
    return data


def resume(session: Any, path: str, key: bytes) -> dict[str, Any]:
    """Replace the session's state by the save at path; its manifest."""
    from .native import Snapshot
    from .template import state_format
    size = memory_size(session)
    limit = len(MAGIC) + 4 + MAX_MANIFEST + 2 * 17 + MAX_STATE + (size // PAGE) * (8 + PAGE) + MAC_BYTES
    data = read_save_file(path, limit)
    manifest, state, pages = decode(data, key, template_key=str(session.template.manifest.get("key")),
                                    state_format=state_format(), memory_size=size)
    del data
    for field, mine in (("project_root", session.project_root), ("files", session.files)):
        if manifest.get(field) != mine:
            raise SaveError(f"the save shows {manifest.get('project_root')!r} in {manifest.get('files')!r} mode and this "
                            f"kernel shows {mine!r} there ({field}): start the kernel from the notebook's folder the save "
                            f"was made in, with the same files mode")
    fd = build_image(str(Path(session.template.directory) / "memory.img"), size, pages)
    try:
        snap = Snapshot.load_bytes(state, fd, session.template.snapshot.engine)
    except ZerobootError as exc:  # the engine's validation of the state refused it
        raise SaveError(f"the save cannot be resumed: {exc}") from None
    finally:
        os.close(fd)  # the snapshot's image holds its own descriptor
    session.replace_with(snap)
    return manifest


# ---- the kernel's side: fetch, write, resume at start -----------------------------------------

Call = Any  # (op, **fields) -> the reply's content, raising on an error reply


def save_to(call: Call, path: Path, notebook: str, key: bytes, chunk: int = 1 << 20) -> tuple[int, dict[str, Any]]:
    """Ask the engine for the save, fetch it in chunks, write it at path; (size, manifest)."""
    from . import engine_requests as req
    got = call(req.SAVE, notebook=notebook, key=key.hex())
    size, manifest = got.get("size"), got.get("manifest")
    if type(size) is not int or size < 0 or not isinstance(manifest, dict):
        raise SaveError("malformed save reply from the engine")

    def chunks() -> Any:
        import base64
        off = 0
        while off < size:
            n = min(chunk, size - off)
            data = base64.b64decode(str(call(req.SAVE_CHUNK, offset=off, size=n).get("data", "")))
            if len(data) != n:
                raise SaveError(f"the engine sent {len(data)} bytes of the save where {n} were asked for")
            yield data
            off += n

    return write_file(path, chunks()), manifest


def resume_from(call: Call, path: Path, key: bytes) -> dict[str, Any]:
    from . import engine_requests as req
    if not path.is_file():
        raise SaveError(f"there is no save {path} (`%sandbox saves` lists them)")
    manifest = call(req.RESUME, path=str(path), key=key.hex()).get("manifest")
    return manifest if isinstance(manifest, dict) else {}


def resumed_text(path: Path, manifest: dict[str, Any]) -> str:
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(manifest.get("created") or 0)))
    return (f"resumed the session saved at {created} from {path}; %rewind starts from here (the checkpoints "
            f"from before the resume are gone). Not saved: " + "; ".join(str(x) for x in manifest.get("not_saved", [])))


def autosave_on() -> bool:
    return os.environ.get("ZEROBOOT_AUTOSAVE", "").lower() in ("on", "1", "true", "yes")


def startup_resume(call: Call, notebook_dir: str) -> str | None:
    """At kernel start: resume ZEROBOOT_RESUME, else (ZEROBOOT_AUTOSAVE=on) this notebook's
    autosave if there is one. What to tell the user, or None."""
    name = os.environ.get("ZEROBOOT_RESUME")
    if not name and autosave_on():
        path = resolve(autosave_name(notebook_id(notebook_dir)))
        if not path.is_file():
            return None
    elif not name:
        return None
    else:
        path = resolve(name)
    try:
        return resumed_text(path, resume_from(call, path, save_key())) + "\n"
    except Exception as exc:  # noqa: BLE001 - the kernel starts anyway, with a fresh session
        log.error("zeroboot: could not resume %s: %s", path, exc)
        return f"could not resume the session save {path}: {exc}\nThis kernel starts with a fresh session.\n"
