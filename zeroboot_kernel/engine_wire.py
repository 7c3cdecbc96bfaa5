"""Messages between the Jupyter kernel process and its engine process: a u32 length, then JSON.

The engine runs in its own single-threaded process (engine_server.py): the kernel process has
threads (ZMQ), and the engine process can be locked down (seccomp) and killed without touching
the kernel.
"""
from __future__ import annotations

import json
import socket
import struct
from typing import Any

from . import schema

LENGTH = struct.Struct("<I")
MAX_MESSAGE = 256 * 1024 * 1024
# Containers the engine adds around a checked guest value (event, content, data, ...).
MAX_DEPTH = schema.MAX_DEPTH + 8


class ChannelClosed(ConnectionError):
    """The other process went away."""


class BadMessage(ValueError):
    """One message was read whole but is not what the protocol allows (not JSON, not an object,
    nested too deep): the channel itself is still in step."""


def encode(msg: dict[str, Any]) -> bytes:
    """A message's bytes; ValueError if it cannot be one (too deep, too large)."""
    if not schema.depth_ok(msg, MAX_DEPTH):
        raise ValueError(f"message nests more than {MAX_DEPTH} levels deep")
    try:
        body = json.dumps(msg, separators=(",", ":"), default=str).encode("utf-8", "surrogatepass")
    except RecursionError:
        raise ValueError("message nests too deep to encode") from None
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE}")
    return LENGTH.pack(len(body)) + body


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    """Send one message; ValueError (nothing sent) if it cannot be encoded."""
    sock.sendall(encode(msg))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ChannelClosed("the engine channel was closed")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> dict[str, Any]:
    (n,) = LENGTH.unpack(_recv_exact(sock, LENGTH.size))
    if n > MAX_MESSAGE:
        raise ChannelClosed(f"oversized message on the engine channel ({n} bytes)")
    body = _recv_exact(sock, n)
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadMessage(f"a message on the engine channel is not JSON: {str(exc)[:200]}") from None
    if not isinstance(msg, dict):
        raise BadMessage("a message on the engine channel is not a JSON object")
    if not schema.depth_ok(msg, MAX_DEPTH):
        raise BadMessage(f"a message on the engine channel nests more than {MAX_DEPTH} levels deep")
    return msg
