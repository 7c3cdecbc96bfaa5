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

LENGTH = struct.Struct("<I")
MAX_MESSAGE = 256 * 1024 * 1024


class ChannelClosed(ConnectionError):
    """The other process went away."""


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    body = json.dumps(msg, separators=(",", ":"), default=str).encode()
    sock.sendall(LENGTH.pack(len(body)) + body)


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
    msg = json.loads(_recv_exact(sock, n))
    if not isinstance(msg, dict):
        raise ChannelClosed("malformed message on the engine channel")
    return msg
