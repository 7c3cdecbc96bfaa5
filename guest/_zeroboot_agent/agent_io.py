"""The guest agent's side of the cell channel (docs/PROTOCOL.md): frames over the UART, batched
stdout/stderr, and the SIGINT gate that keeps an interrupt from tearing a frame in half.

Only the standard library is used here: this module is imported before IPython. The agent itself
is synchronous, but user code may start threads (the engine runs them on the VM's one CPU), so the
channel's writes take a lock, and only the main thread, where Python runs signal handlers, guards
its channel updates against the interrupt.
"""
from __future__ import annotations

import base64
import io
import json
import numbers
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
# User code may replace builtins (`builtins.len = ...`); the agent's own code must not follow,
# so the builtins it uses are bound as this module's globals.
from builtins import bool, bytes, dict, getattr, int, isinstance, len, list, max, min, range, str, tuple  # noqa: A004

from .frame_protocol import (BINARY_TYPES, HEADER, IDLE_TYPES, MAX_PAYLOAD, REPLY_TYPES, FrameType, header_ok,
                             pack_binary, pack_header, unpack_binary)

STREAM_MAX_BUFFER = 4096      # send once this much text is pending (PROTOCOL.md: 4 KiB)
STREAM_INTERVAL = 0.05        # send a completed line only if the last STREAM frame is this old
# One STREAM frame carries at most this many characters: JSON can grow a character to 6 bytes
# (\uXXXX), so a chunk always stays well below MAX_PAYLOAD however large a single write() is.
STREAM_MAX_CHUNK = 1 << 20
CHECK_RESERVE = 64  # bytes the self-check fields add to a payload

READ_SIZE = 1 << 16


class ProtocolError(Exception):
    """The host sent something that is not a frame: the channel cannot be resynchronised."""


def log(message: str) -> None:
    """Diagnostics for whoever runs the VM: the real fd 2 (the guest's console), never a STREAM
    frame. Between requests the host drops console output; during one it shows in the cell's
    stderr, as all of fd 1/2 does (C-level output)."""
    data = ("zeroboot agent: " + message.rstrip("\n") + "\n").encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(2, data):]
    except OSError:
        pass


def safe_str(value: object) -> str:
    """str(value), even for objects whose __str__ is broken (an error report must go out)."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - anything user-defined can fail here
        return f"<unprintable {type(value).__name__} object>"


def _json_default(obj: Any) -> Any:
    """JSON for what display formatters and user_expressions may hand us: binary MIME data
    becomes base64 (as in Jupyter messages), anything else exotic becomes text."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    # numpy scalars and the like register with the numbers ABCs
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    return safe_str(obj)


def encode_payload(payload: dict[str, Any]) -> bytes:
    """UTF-8 JSON. Lone surrogates (possible in Python str, e.g. from surrogateescape) cannot be
    encoded as UTF-8, so such payloads fall back to ASCII JSON with \\u escapes."""
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"),
                          default=_json_default).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload, ensure_ascii=True, separators=(",", ":"),
                          default=_json_default).encode("ascii")


class InterruptGate:
    """Decides what a SIGINT (the host's interrupt) does: it reaches user code only, at most once
    per request it was meant for, and never the agent's own machinery (docs/PROTOCOL.md,
    Interrupts).

    The host raises SIGINT only for the request it has pushed and not yet seen the reply of, and
    only once the agent waits for that request (it waits for the agent to block on the UART before
    pushing one). So the agent's phase decides:

      waiting   between requests, reading and decoding the next one: the interrupt is for that
                request; it is held.
      shell     the request runs, but in IPython's machinery around the user's code (history,
                events, compilation, traceback formatting): held; raised where the user's code
                next starts (the shell's run_code asks take_held).
      user      user code runs: KeyboardInterrupt, unless a frame or the stream buffer is being
                updated (`critical`): then it is held and raised once that is done (release).
      finishing the request's code has ended, its reply is being built and sent: the interrupt
                was for a request that has ended, so it is dropped (as ipykernel drops a late
                SIGINT).
    """

    WAITING, SHELL, USER, FINISHING = "waiting", "shell", "user", "finishing"

    def __init__(self) -> None:
        self.phase = self.FINISHING  # start-up: nothing to interrupt until READY is out
        self.critical = 0            # depth of channel updates in progress
        self.pending = False
        # while a cell runs as a task of the agent's loop (agent_loop.py): takes an interrupt that
        # lands outside the cell's own code by cancelling the cell (True), as ipykernel does
        self.elsewhere: Callable[[], bool] | None = None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signo: int, frame: object) -> None:
        if self.phase == self.FINISHING:
            return
        if self.phase != self.USER or self.critical:
            self.pending = True
            return
        self._raise()

    def _raise(self) -> None:
        if self.elsewhere is not None and self.elsewhere():
            return
        raise KeyboardInterrupt

    def wait_for_request(self) -> None:
        """The reply to the last request is out: an interrupt from now on is for the next one."""
        self.phase = self.WAITING
        self.pending = False

    def begin_request(self) -> None:
        """The request runs; its user code has not started yet (an interrupt stays held)."""
        self.phase = self.SHELL

    def take_held(self) -> bool:
        """User code is about to start: True if an interrupt is held for it (the caller raises
        it there), and from now on the request's interrupts go to user code."""
        held, self.pending = self.pending, False
        self.phase = self.USER
        return held

    def leave_user_code(self, previous: str) -> None:
        """A piece of user code has ended: back to the phase before it (the shell's machinery,
        where interrupts are held until user code runs again, or the user code that ran it)."""
        self.phase = previous if previous != self.WAITING else self.SHELL

    def enter_user_code(self) -> None:
        """User code starts (completion, inspection: the agent's own calls into user objects);
        an interrupt held for this request is raised now."""
        if self.take_held():
            raise KeyboardInterrupt

    def end_request(self) -> None:
        """The request's code has ended: its interrupts are dropped from now on."""
        self.phase = self.FINISHING
        self.pending = False

    def release(self) -> None:
        """Raise an interrupt held during a channel update (called once the update is complete)."""
        if self.pending and self.phase == self.USER and not self.critical:
            self.pending = False
            self._raise()


class _ChannelUpdate:
    """A channel update: under the channel's lock (threads of user code write too), and, in the
    main thread, marked critical for the interrupt gate (a KeyboardInterrupt is raised only in the
    main thread, so another thread's update cannot be torn by one)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.main = False

    def __enter__(self) -> None:
        self.channel.lock.acquire()
        self.main = threading.current_thread() is _MAIN_THREAD
        if self.main:
            self.channel.gate.critical += 1

    def __exit__(self, *exc: object) -> None:
        if self.main:
            self.channel.gate.critical -= 1
        self.channel.lock.release()
        if self.main:
            self.channel.gate.release()


_MAIN_THREAD = threading.main_thread()


class Channel:
    """Frames to and from the host over one file descriptor, plus the stream batching.

    All output goes through send(), which first flushes pending stream text, so the host sees
    output in the order the cell produced it. Output that a background thread writes while no
    request runs (between the reply and the next request: the engine runs threads then) goes out
    as it comes, each completed line (or STREAM_MAX_BUFFER characters) at once, in STREAM frames
    numbered `idle` instead of `seq` (docs/PROTOCOL.md, Output between requests): the host
    publishes it live, as ipykernel does. A line not completed yet goes with the next request.
    """

    def __init__(self, fd: int, gate: InterruptGate) -> None:
        self.fd = fd
        self.gate = gate
        self._rbuf = bytearray()  # survives an interrupted read: a frame is never half-consumed
        # Stream batching: one pending buffer for both streams; switching stream flushes first,
        # which keeps stdout/stderr interleaving exact.
        self._pending: list[str] = []
        self._pending_name = "stdout"
        self._pending_len = 0
        self._pending_eol = False
        self._last_stream = float("-inf")
        # The channel's self-check (docs/PROTOCOL.md): every frame of a request carries its
        # number `seq` (0, 1, 2, ...), and the reply carries `stream_chars`, the number of
        # characters the request wrote to sys.stdout/sys.stderr; the host compares both with
        # what it received, so a lost, duplicated or reordered frame cannot go unnoticed.
        self._seq = 0
        self._stream_chars = 0
        # Before READY (start-up, warm-up) nothing may reach the host as frames: `quiet` makes
        # send() drop frames, and `quiet_stream` (if set) receives stream text instead.
        self.quiet = False
        self.quiet_stream: Callable[[str, str], None] | None = None
        self.lock = threading.RLock()
        self._in_request = False
        self._idle_seq = 0  # the number of the next frame sent between requests (reset by each reply)
        # In a process the cell forked (os.fork()) the channel is not this process's: only the
        # agent (process 1) talks to the host, and the engine drops a child's frames. A child's
        # sys.stdout/sys.stderr text goes to its fd 1/2 instead, which reach the cell as output
        # while a request runs, as a forked child's print reaches the cell under ipykernel (its
        # OutStream forwards a child's text to the kernel process).
        self.forked = False
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        """In the new child: text pending at the fork is the parent's to send (not sent twice),
        and from now on this process's stream text goes to its own fd 1/2 (child_write). The
        lock is not taken: another thread of the parent may have held it at the fork."""
        self.forked = True
        self._pending = []
        self._pending_len = 0
        self._pending_eol = False
        self.lock = threading.RLock()

    def child_write(self, name: str, text: str) -> None:
        """A forked child's stream text: written at once to fd 1 (stdout) or 2 (stderr), as the
        raw bytes a child's os.write would give (the host shows them in the cell). A closed or
        broken descriptor drops the text, as a write to it would."""
        try:
            data = text.encode("utf-8", "surrogateescape")  # bytes a file name or os.read gave back
        except UnicodeEncodeError:
            data = text.encode("utf-8", "backslashreplace")
        fd = 1 if name == "stdout" else 2
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            pass

    # ---- writing -------------------------------------------------------------------------

    def send(self, ftype: int, payload: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        """Send one frame (after any pending stream text). An interrupt that arrives meanwhile
        is raised once the frame is out (InterruptGate), never half-way through it. `buffers`
        (raw bytes) go with the frames of BINARY_TYPES (comm messages)."""
        if self.forked:
            if ftype == FrameType.ERROR:  # an exception the child's cell code raised: its traceback
                tb = payload.get("traceback")
                self.child_write("stderr", "\n".join(safe_str(line) for line in tb) + "\n" if isinstance(tb, list)
                                 else f"{safe_str(payload.get('ename'))}: {safe_str(payload.get('evalue'))}\n")
                return
            _child_frame(ftype)
            return
        with _ChannelUpdate(self):
            if ftype != FrameType.STREAM:
                self.flush_stream()
            if self.quiet:
                return
            body = encode_payload(payload)
            extra = sum(len(b) + 4 for b in buffers or ()) + 8 if ftype in BINARY_TYPES else 0
            if len(body) + extra > MAX_PAYLOAD - CHECK_RESERVE:
                buffers = None
                replacement = _oversize_replacement(ftype, payload, len(body) + extra)
                if replacement is None:
                    return
                ftype, payload = replacement
                body = encode_payload(payload)
                if ftype == FrameType.STREAM:  # a note instead of the output: it counts as stream text
                    self._stream_chars += len(str(payload.get("text", "")))
            # output and widget messages between requests; any other frame there (READY) is
            # numbered as a request's
            idle = not self._in_request and ftype in IDLE_TYPES
            check = {"idle": self._idle_seq} if idle else {"seq": self._seq}
            if ftype in REPLY_TYPES:
                check["stream_chars"] = self._stream_chars
            body = _with_check(body, check)
            if ftype in BINARY_TYPES:
                body = pack_binary(body, list(buffers or ()))
            self._write_all(pack_header(ftype, len(body)) + body)
            if idle:
                self._idle_seq += 1
            else:
                self._seq += 1
            if ftype in REPLY_TYPES:
                self._in_request = False
                self._idle_seq = 0

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
        except OSError as exc:
            # The host is gone (or the descriptor is broken): nobody can receive anything more,
            # and unwinding through the user's code would only try to write again.
            log(f"cannot write to the host: {exc}")
            os._exit(3)

    # ---- stream batching -----------------------------------------------------------------

    def stream_write(self, name: str, text: str) -> None:
        if not text:
            return
        if self.forked:
            self.child_write(name, text)
            return
        with _ChannelUpdate(self):  # the buffer and its counters change together or not at all
            if self._pending and name != self._pending_name:
                self.flush_stream()
            self._pending_name = name
            self._pending.append(text)
            self._pending_len += len(text)
            if not self.quiet:
                self._stream_chars += len(text)
            if "\n" in text or "\r" in text:
                self._pending_eol = True
            if not self._in_request and not self.quiet:
                # a background thread between requests: each completed line goes out at once
                if self._pending_eol or self._pending_len >= STREAM_MAX_BUFFER:
                    self.flush_stream()
                return
            if self._pending_len >= STREAM_MAX_BUFFER:
                self.flush_stream()
            elif self._pending_eol and time.monotonic() - self._last_stream >= STREAM_INTERVAL:
                self.flush_stream()

    def new_request(self) -> None:
        """A request starts: its frames are numbered from 0, its stream characters counted from
        0, and its first line of output goes out at once, however recently the previous
        request's last STREAM frame was sent. Text a background thread wrote since the last
        reply and not sent yet (a line it did not complete) is this request's first output (and
        counted in its stream characters)."""
        with self.lock:
            self._seq = 0
            self._stream_chars = self._pending_len
            self._last_stream = float("-inf")
            self._in_request = True

    def flush_stream(self) -> None:
        """Send all pending stream text now (between requests too: send numbers those frames `idle`)."""
        if not self._pending:
            return
        with _ChannelUpdate(self):  # taken out of the buffer means sent: no interrupt in between
            if not self._pending:
                return
            text = "".join(self._pending)
            name = self._pending_name
            self._pending.clear()
            self._pending_len = 0
            self._pending_eol = False
            if self.quiet:
                if self.quiet_stream is not None:
                    self.quiet_stream(name, text)
                return
            for start in range(0, len(text), STREAM_MAX_CHUNK):
                self.send(FrameType.STREAM, {"name": name, "text": text[start:start + STREAM_MAX_CHUNK]})
            self._last_stream = time.monotonic()

    # ---- reading -------------------------------------------------------------------------

    def read_frame(self) -> tuple[int, dict[str, Any]] | None:
        """The next frame (type, payload), or None when the host closed the channel.

        Short reads are normal. If a KeyboardInterrupt interrupts the read, the bytes read so
        far stay in the buffer and the next call continues the same frame.
        """
        while True:
            if len(self._rbuf) >= HEADER.size:
                magic, version, ftype, length = HEADER.unpack_from(self._rbuf)
                if not header_ok(magic, version, length):
                    raise ProtocolError(f"bad frame header magic={magic:#x} version={version} "
                                        f"length={length}")
                end = HEADER.size + length
                if len(self._rbuf) >= end:
                    body = bytes(self._rbuf[HEADER.size:end])
                    del self._rbuf[:end]
                    buffers: list[bytes] = []
                    try:
                        if ftype in BINARY_TYPES:
                            body, buffers = unpack_binary(body)
                        payload = json.loads(body)
                    except ValueError as exc:
                        log(f"frame type {ftype}: undecodable payload ({exc}); ignored")
                        continue
                    if not isinstance(payload, dict):
                        log(f"frame type {ftype}: payload is not a JSON object; ignored")
                        continue
                    if ftype in BINARY_TYPES:
                        payload["buffers"] = buffers
                    return ftype, payload
                want = end - len(self._rbuf)
            else:
                want = HEADER.size - len(self._rbuf)
            try:
                chunk = os.read(self.fd, max(want, READ_SIZE))
            except OSError as exc:
                log(f"cannot read from the host: {exc}")
                os._exit(3)
            if not chunk:
                return None
            self._rbuf += chunk


def _child_frame(ftype: int) -> None:
    """A forked child tried to send a frame (display(), a comm message): only the agent process
    talks to the host, so it is not sent; said once per frame type on the child's stderr, which
    reaches the cell, instead of vanishing."""
    if ftype in _CHILD_FRAMES_SAID or ftype in REPLY_TYPES:
        return  # a reply: the child went on past the cell's code (it did not _exit); nobody waits for it
    _CHILD_FRAMES_SAID.add(ftype)
    try:
        name = FrameType(ftype).name
    except ValueError:
        name = str(ftype)
    note = (f"[zeroboot: process {os.getpid()} is a fork of the kernel; its {name} output (display, "
            f"comm messages) cannot reach the notebook, only its printed text does]\n")
    try:
        os.write(2, note.encode("utf-8", "replace"))
    except OSError:
        pass


_CHILD_FRAMES_SAID: set[int] = set()


def _with_check(body: bytes, check: dict[str, int]) -> bytes:
    """Add the self-check fields to an encoded JSON object without encoding it again (the
    payload may be megabytes): `{...}` becomes `{..., "seq": n, ...}`."""
    extra = json.dumps(check, separators=(",", ":")).encode("ascii")
    if body == b"{}":
        return extra
    return body[:-1] + b"," + extra[1:]


def _oversize_replacement(ftype: int, payload: dict[str, Any],
                          size: int) -> tuple[int, dict[str, Any]] | None:
    """What to send instead of a frame over MAX_PAYLOAD: the host would kill the VM for it."""
    note = f"[zeroboot: output of {size / (1 << 20):.1f} MiB dropped: a frame holds at most 16 MiB]\n"
    if ftype in (FrameType.DISPLAY, FrameType.RESULT, FrameType.STREAM, FrameType.COMM_MESSAGE):
        return FrameType.STREAM, {"name": "stderr", "text": note}
    if ftype == FrameType.COMM_DONE:
        return FrameType.COMM_DONE, {"id": payload.get("id"), "status": "error", "ename": "ValueError",
                                     "evalue": note.strip(), "traceback": [note]}
    if ftype == FrameType.COMM_INFO_REPLY:
        return FrameType.COMM_INFO_REPLY, {"id": payload.get("id"), "comms": {}}
    if ftype == FrameType.ERROR:
        return FrameType.ERROR, {"ename": str(payload.get("ename", ""))[:1000],
                                 "evalue": str(payload.get("evalue", ""))[:10000], "traceback": [note]}
    if ftype == FrameType.DONE:
        small = {k: v for k, v in payload.items() if k not in ("user_expressions", "payload", "traceback")}
        small.update(user_expressions={}, payload=[])
        if "traceback" in payload:
            small["traceback"] = [note]
            small["evalue"] = str(small.get("evalue", ""))[:10000]
        return FrameType.DONE, small
    if ftype == FrameType.COMPLETE_REPLY:
        return FrameType.COMPLETE_REPLY, {**payload, "matches": [], "metadata": {}}
    if ftype == FrameType.INSPECT_REPLY:
        return FrameType.INSPECT_REPLY, {**payload, "found": False, "data": {}, "metadata": {}}
    log(f"frame type {ftype} of {size} bytes is over the limit; dropped")
    return None


class FrameStream(io.TextIOBase):
    """sys.stdout / sys.stderr: text goes to the channel's batching (STREAM frames). fileno() is the
    process's fd 1 or 2, the console, whose writes the host streams to the running cell as it does
    C-level output (as ipykernel's OutStream, whose fileno() is a copy of the kernel's own fd:
    faulthandler, `subprocess.run(..., stdout=sys.stdout)` and libraries that ask for the
    descriptor work; here what they write there reaches the cell, like the rest of fd 1/2)."""

    def __init__(self, channel: Channel, name: str) -> None:
        super().__init__()
        self._channel = channel
        self._name = name

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"<{self._name}>"

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "UTF-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "strict"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return 1 if self._name == "stdout" else 2

    def write(self, text: str) -> int:  # type: ignore[override]
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._channel.stream_write(self._name, text)
        return len(text)

    def flush(self) -> None:
        # An explicit flush is honoured at once (as in ipykernel): the agent has no flushing
        # timer thread, so it is the only way a cell can push out a line that the 50 ms rule held
        # back before it goes on computing.
        self._channel.flush_stream()


def install_streams(channel: Channel) -> None:
    sys.stdout = FrameStream(channel, "stdout")
    sys.stderr = FrameStream(channel, "stderr")
