"""Network egress (issue 17): the policy (network_policy.py), TCP through the engine's host sockets
(native/file_inet.c, sys_inet.c), the sandbox's resolver (net_dns.c) with hostile queries, sockets
across checkpoints and rewinds, and the kernel's read-only `%sandbox network`.

Every connection goes to a server this test starts on 127.0.0.1; names come from
ZEROBOOT_NETWORK_HOSTS or the host's /etc/hosts (`localhost`), never from a DNS server.
"""
from __future__ import annotations

import http.server
import json
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from session_helpers import cell
from zeroboot_kernel import network_policy
from zeroboot_kernel.kernel_config import KernelConfigError, KernelSettings
from zeroboot_kernel.network_policy import NetworkPolicyError

CSV = b"city,people\nParis,2100000\nLyon,520000\n"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = CSV if self.path.endswith(".csv") else f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/csv" if self.path.endswith(".csv") else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def net_session(template, server):
    """A session whose engine allows 127.0.0.1:PORT, the mapped name data.test:PORT and localhost
    on any port (which its DNS answer, loopback, cannot use)."""
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"127.0.0.1:{server},data.test:{server},localhost:*",
                                            "data.test=127.0.0.1"))
    s = Session(template)
    try:
        yield s
    finally:
        s.close()
        engine.set_network(None)


def ok(s, code: str) -> str:
    r = cell(s, code)
    assert r["status"] == "ok", (r.get("evalue"), r["stdout"][-3000:])
    return r["stdout"]


# ---- the policy (host side only) ----------------------------------------------------------------

@pytest.mark.without_kvm
def test_policy_entries_and_default_ports() -> None:
    p = network_policy.parse("pypi.org, *.GitHubUserContent.com:443, 127.0.0.1:8000, 10.0.0.0/8:*, [::1]:8080, "
                             "2001:db8::/32, data.test.")
    texts = [r.text() for r in p.rules]
    assert texts == ["pypi.org:80", "pypi.org:443", "*.githubusercontent.com:443", "127.0.0.1:8000", "10.0.0.0/8:*",
                     "[::1]:8080", "[2001:db8::/32]:80", "[2001:db8::/32]:443", "data.test:80", "data.test:443"]
    assert not network_policy.parse(None).enabled and not network_policy.parse(" none ").enabled
    assert network_policy.NetworkPolicy.from_wire(p.to_wire()) == p
    hosts = network_policy.parse("data.test:81", "data.test=127.0.0.1, v6.test=[::1]")
    assert hosts.hosts == (("data.test", "127.0.0.1"), ("v6.test", "::1"))
    assert "data.test = 127.0.0.1" in hosts.describe() and "none" in network_policy.NetworkPolicy().describe()


@pytest.mark.without_kvm
@pytest.mark.parametrize("value, hosts, words", [
    ("pypi.org:99999", None, "1-65535"),
    ("pypi.org:http", None, "1-65535"),
    ("*", None, "0.0.0.0/0"),
    ("*pypi.org", None, "wildcard"),
    ("py pi.org", None, "not a host name"),
    ("a..b", None, "not a host name"),
    ("x" * 64 + ".org", None, "not a host name"),
    ("300.1.1.1", None, "not an address"),
    ("10.0.0.0/33", None, "not an address"),
    ("[::1", None, "missing ']'"),
    ("[1.2.3.4]:80", None, "IPv6"),
    ("pypi.org,,x.org", None, "empty entry"),
    ("none,pypi.org", None, "cannot be combined"),
    ("pypi.org", "data.test", "name=address"),
    ("pypi.org", "data.test=nowhere", "not an IP address"),
    ("none", "data.test=127.0.0.1", "ZEROBOOT_NETWORK is none"),
    (",".join(f"h{i}.org" for i in range(200)), None, "at most 256"),
])
def test_malformed_policy_is_refused_with_what_to_fix(value: str, hosts: str | None, words: str) -> None:
    with pytest.raises(NetworkPolicyError, match=words.replace("*", r"\*").replace("[", r"\[")):
        network_policy.parse(value, hosts)
    env = {"ZEROBOOT_NETWORK": value, **({"ZEROBOOT_NETWORK_HOSTS": hosts} if hosts else {})}
    with pytest.raises(KernelConfigError, match="kernelspec"):
        KernelSettings.from_env(env)


@pytest.mark.without_kvm
@pytest.mark.parametrize("wire", [
    "[]", '{"rules": {}, "hosts": []}', '{"rules": [["cidr", "", "nope", 80]], "hosts": []}',
    '{"rules": [["name", "a b", "", 80]], "hosts": []}', '{"rules": [["name", "a.org", "", 70000]], "hosts": []}',
    '{"rules": [["shell", "a.org", "", 80]], "hosts": []}', '{"rules": [["name", "a.org", "", "80"]], "hosts": []}',
    '{"rules": [], "hosts": [["a.org"]]}', '{"rules": [], "hosts": [["a.org", "1.2.3"]]}',
])
def test_the_engine_process_checks_the_policy_it_is_sent(wire: str) -> None:
    with pytest.raises(NetworkPolicyError):
        network_policy.NetworkPolicy.from_wire(wire)


# ---- connections ---------------------------------------------------------------------------------

def test_no_policy_means_no_network(template, server) -> None:
    """Without a policy TCP sockets exist, on the sandbox's own loopback only: the host's server on
    127.0.0.1 is refused, any other address unreachable; UDP and name lookups fail."""
    from zeroboot_kernel.session import Session
    s = Session(template)
    try:
        out = ok(s, f"""
import errno, socket
for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_STREAM),
                     (socket.AF_INET, socket.SOCK_DGRAM)):
    try:
        socket.socket(family, kind).close()
        print("allowed")
    except PermissionError as exc:
        print("refused", exc.errno == errno.EACCES)
try:
    socket.getaddrinfo("data.test", 80)
except socket.gaierror:
    print("no resolver")
import urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:{server}/x", timeout=5)
except OSError as exc:
    print("urlopen failed", type(exc).__name__, getattr(exc.reason, "errno", None) == errno.ECONNREFUSED)
try:
    socket.create_connection(("198.51.100.7", 80), timeout=5)
except OSError as exc:
    print("unreachable", exc.errno == errno.ENETUNREACH)
""")
        assert out.split("\n")[:6] == ["allowed", "allowed", "refused True", "no resolver",
                                        "urlopen failed URLError True", "unreachable True"], out
    finally:
        s.close()


def test_urllib_and_pandas_read_an_allowed_server(net_session, server) -> None:
    out = ok(net_session, f"""
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:{server}/x").read().decode())
import pandas as pd
df = pd.read_csv("http://127.0.0.1:{server}/cities.csv")
print(df.people.sum(), list(df.city))
""")
    assert "hello /x" in out and "2620000 ['Paris', 'Lyon']" in out, out


def test_names_resolve_through_the_sandbox_resolver(net_session, server) -> None:
    out = ok(net_session, f"""
import socket, urllib.request
print(sorted({{a[4][0] for a in socket.getaddrinfo("data.test", {server}, type=socket.SOCK_STREAM)}}))
print(urllib.request.urlopen("http://data.test:{server}/named").read().decode())
try:
    socket.getaddrinfo("elsewhere.test", 80)
except socket.gaierror as exc:
    print("gaierror", exc.errno == socket.EAI_NONAME)
""")
    assert "['127.0.0.1']" in out and "hello /named" in out and "gaierror True" in out, out
    assert "resolver answered NXDOMAIN for elsewhere.test" in out and "ZEROBOOT_NETWORK" in out, out


def test_refused_addresses_and_ports_say_how_to_allow_them(net_session, server) -> None:
    r = cell(net_session, f"import socket\nsocket.create_connection(('127.0.0.2', {server}))")
    assert r["status"] == "error" and r["ename"] == "PermissionError", r
    assert f"127.0.0.2:{server} is not in the allow list" in r["stdout"] and "ZEROBOOT_NETWORK" in r["stdout"], r
    assert any("network policy refused this connection" in line for line in r["traceback"]), r["traceback"]
    # the same note on urllib's URLError, which wraps the PermissionError
    r = cell(net_session, f"import urllib.request\nurllib.request.urlopen('http://127.0.0.9:{server}/')")
    assert r["ename"] == "URLError" and any("network policy refused" in line for line in r["traceback"]), r
    r = cell(net_session, f"import socket\nsocket.create_connection(('127.0.0.1', {server + 1 if server < 65535 else 1}))")
    assert r["status"] == "error" and "is allowed, but not on port" in r["stdout"], r
    # bind/listen/accept: no servers
    out = ok(net_session, """
import socket
s = socket.socket()
try:
    s.bind(("127.0.0.1", 0))
except PermissionError:
    print("bind refused")
""")
    assert "bind refused" in out


def test_a_name_that_dns_points_at_loopback_reaches_nothing(net_session, server) -> None:
    """`localhost` is allowed by name, and the host's resolver says 127.0.0.1: an answer of DNS
    (not of the operator's map) leads only to public addresses (no DNS rebinding)."""
    r = cell(net_session, f"""
import socket, struct
q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\\x09localhost\\x00" + struct.pack(">HH", 1, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(q, ("192.0.2.53", 53))
a = u.recv(512)
print("rcode", a[3] & 15, "answers", struct.unpack(">H", a[6:8])[0], "addr", socket.inet_ntoa(a[-4:]))
socket.create_connection((socket.inet_ntoa(a[-4:]), {server + 1 if server < 65535 else 1}))
""")
    # (another port than the one 127.0.0.1 is allowed on, so that only the name could allow it)
    assert "rcode 0 answers 1 addr 127.0.0.1" in r["stdout"], r
    assert r["status"] == "error" and "not a public address" in r["stdout"] and "DNS rebinding" in r["stdout"], r


def test_non_blocking_connect_select_and_so_error(net_session, server) -> None:
    out = ok(net_session, f"""
import errno, select, socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rc = s.connect_ex(("127.0.0.1", {server}))
print("connect", rc in (0, errno.EINPROGRESS))
_, w, _ = select.select([], [s], [], 30)
print("writable", w == [s], "so_error", s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
print("nodelay", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0)
print("peer", s.getpeername() == ("127.0.0.1", {server}), "name", s.getsockname()[0])
s.sendall(b"GET /nb HTTP/1.0\\r\\n\\r\\n")
data = b""
while not data.endswith(b"hello /nb"):
    r, _, _ = select.select([s], [], [], 30)
    assert r, "nothing to read in 30 s"
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
print("got", data.endswith(b"hello /nb"))
try:
    s.recv(10)
except BlockingIOError:
    print("eagain")
s.close()
""")
    assert "connect True" in out and "writable True so_error 0" in out and "nodelay True" in out, out
    assert "peer True name 127.0.0.1" in out and "got True" in out, out


@pytest.mark.parametrize("host", ["127.0.0.1", "data.test"])
def test_asyncio_open_connection(net_session, server, host) -> None:
    """By address, and by a name: asyncio resolves names with getaddrinfo in a worker thread."""
    out = ok(net_session, f"""
import asyncio
async def fetch():
    reader, writer = await asyncio.open_connection({host!r}, {server})
    writer.write(b"GET /aio HTTP/1.0\\r\\n\\r\\n")
    await writer.drain()
    body = await reader.read()
    writer.close()
    return body.split(b"\\r\\n\\r\\n", 1)[1]
print(await fetch())
""")
    assert "b'hello /aio'" in out, out


def test_a_connection_survives_checkpoints_and_reads_as_reset_after_a_rewind(net_session, server) -> None:
    s = net_session
    ok(s, f"import socket\nconn = socket.create_connection(('127.0.0.1', {server}))")
    s.prepare_next_cell()  # the checkpoint before the next cell copies the socket: the live one stays
    out = ok(s, "conn.sendall(b'GET /kept HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n'); import time\n"
                "data = b''\nwhile b'hello /kept' not in data: data += conn.recv(4096)\nprint('kept', len(data) > 0)")
    assert "kept True" in out, out
    s.prepare_next_cell()
    s.rewind(1)  # back to the checkpoint, whose copy of the connection has no host socket
    out = ok(s, """
import errno, select
r, w, _ = select.select([conn], [conn], [], 0)
print("ready", r == [conn], w == [conn])
try:
    conn.recv(10)
except ConnectionResetError:
    print("reset")
try:
    conn.send(b"x")
except BrokenPipeError:
    print("epipe")
conn.close()
""")
    assert "ready True True" in out and "reset" in out and "epipe" in out, out
    # and a new connection works after the rewind
    assert "hello /again" in ok(s, f"import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{server}/again').read())")


def test_a_cell_cannot_widen_the_policy(net_session, server) -> None:
    r = cell(net_session, f"""
import os, socket
os.environ["ZEROBOOT_NETWORK"] = "0.0.0.0/0:*"
try:
    open("/etc/resolv.conf", "w").write("nameserver 127.0.0.1\\n")
except OSError as exc:
    print("resolv.conf", type(exc).__name__)
socket.create_connection(("127.0.0.3", {server}))
""")
    assert "resolv.conf" in r["stdout"] and r["status"] == "error" and r["ename"] == "PermissionError", r


# ---- the resolver with hostile queries ------------------------------------------------------------

def _query(qid: int, name: bytes, qtype: int = 1, flags: int = 0x0100, qd: int = 1, an: int = 0, klass: int = 1) -> bytes:
    return struct.pack(">HHHHHH", qid, flags, qd, an, 0, 0) + name + struct.pack(">HH", qtype, klass)


def _label(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"


HOSTILE = {
    "short": b"\x00\x01\x01",
    "header only": struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 0),
    "pointer loop": struct.pack(">HHHHHH", 2, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c" + struct.pack(">HH", 1, 1),
    "pointer forward": struct.pack(">HHHHHH", 3, 0x0100, 1, 0, 0, 0) + b"\x04data\xc0\x20" + b"\0" * 20,
    "label past the end": struct.pack(">HHHHHH", 4, 0x0100, 1, 0, 0, 0) + b"\x3fdata",
    "label of 64": _query(5, b"\x40" + b"a" * 64 + b"\x00"),
    "name of 300": _query(6, b"".join(b"\x3f" + b"a" * 63 for _ in range(5)) + b"\x00"),
    "no type": struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + _label("data.test") + b"\x00",
    "two questions": _query(8, _label("data.test"), qd=2),
    "an answer in a query": _query(9, _label("data.test"), an=1),
    "a response": _query(10, _label("data.test"), flags=0x8100),
    "opcode 2": _query(11, _label("data.test"), flags=0x1100),
    "class CH": _query(12, _label("data.test"), klass=3),
    "dot in a label": _query(13, b"\x09data.test\x00"),
    "nul in a label": _query(14, b"\x04da\x00a\x04test\x00"),
    "root": _query(15, b"\x00"),
    "not allowed": _query(16, _label("evil.test")),
    "MX of an allowed name": _query(17, _label("data.test"), qtype=15),
    "oversized": _query(18, _label("data.test")) + b"\0" * 5000,
}
# rcode expected, or None: no answer (dropped), or "EMSGSIZE"
EXPECTED = {
    "short": None, "header only": 1, "pointer loop": 1, "pointer forward": 1, "label past the end": 1,
    "label of 64": 1, "name of 300": 1, "no type": 1, "two questions": 1, "an answer in a query": 1,
    "a response": None, "opcode 2": 4, "class CH": 5, "dot in a label": 1, "nul in a label": 1, "root": 5,
    "not allowed": 3, "MX of an allowed name": 0, "oversized": "EMSGSIZE",
}


def test_hostile_dns_queries_are_answered_within_bounds(net_session) -> None:
    packets = {k: v.hex() for k, v in HOSTILE.items()}
    out = ok(net_session, f"""
import json, random, socket, struct
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setblocking(False)
got = {{}}
for name, hexed in {json.dumps(packets)}.items():
    q = bytes.fromhex(hexed)
    try:
        u.sendto(q, ("192.0.2.53", 53))
    except OSError as exc:
        got[name] = "EMSGSIZE" if exc.errno == 90 else str(exc)
        continue
    try:
        a = u.recv(4096)
    except BlockingIOError:
        got[name] = None
        continue
    assert a[:2] == q[:2] and a[2] & 0x80 and len(a) <= 512, (name, a)
    got[name] = a[3] & 15
print("RESULT", json.dumps(got))
rng = random.Random(17)
for i in range(3000):  # random packets, and random mutations of a good query
    if i % 2:
        q = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600)))
    else:
        q = bytearray(bytes.fromhex({_query(1, _label("data.test")).hex()!r}))
        for _ in range(rng.randrange(1, 6)):
            q[rng.randrange(len(q))] = rng.randrange(256)
        q = bytes(q)
    u.sendto(q, ("192.0.2.53", 53))
    try:
        a = u.recv(4096)
        assert len(a) <= 512 and a[2] & 0x80
    except BlockingIOError:
        pass
print("fuzzed", sorted(a[4] for a in socket.getaddrinfo("data.test", 80, socket.AF_INET, socket.SOCK_STREAM)))
try:
    u.sendto(b"x", ("127.0.0.1", 53))
except PermissionError:
    print("udp elsewhere refused")
""")
    got = json.loads(out.split("RESULT ", 1)[1].split("\n", 1)[0])
    assert got == EXPECTED, got
    assert "fuzzed [('127.0.0.1', 80)]" in out and "udp elsewhere refused" in out, out


# ---- the kernel and its engine process ------------------------------------------------------------

@pytest.mark.parametrize("policy", [None, "127.0.0.1:9"])
def test_the_engine_process_seccomp_follows_the_policy(template, policy: str | None) -> None:
    """No socket syscall at all without a policy; with one, client sockets but never a server."""
    from zeroboot_kernel import engine_requests as req
    from zeroboot_kernel.engine_client import EngineClient
    wire = network_policy.parse(policy).to_wire() if policy else None
    client = EngineClient(network=wire)
    try:
        checks = client.call(req.LOCKDOWN_CHECK)["checks"]
    finally:
        client.close()
    assert checks["network"] == ("allowed" if policy else "EPERM"), checks
    assert checks["server"] == "EPERM" and checks["netlink"] == "EPERM" and checks["spawn"] == "EPERM", checks


def test_the_kernel_takes_its_policy_from_the_kernelspec_only(template, server) -> None:
    from kernel_helpers import execute, kernel, stream_text
    resolver = _TestResolver({"pub.test": "93.184.216.34"})
    with kernel("zeroboot", ZEROBOOT_NETWORK=f"127.0.0.1:{server},localhost,pub.test",
                ZEROBOOT_NETWORK_RESOLVER=f"127.0.0.1:{resolver.port}") as (_, kc):
        reply, msgs = execute(kc, "%sandbox network")
        assert reply["status"] == "ok" and f"127.0.0.1:{server}" in stream_text(msgs), msgs
        reply, msgs = execute(kc, "%sandbox network 0.0.0.0/0:*")
        assert reply["status"] == "error" and "only shows the policy" in reply["evalue"] and "kernelspec" in reply["evalue"], reply
        reply, msgs = execute(kc, f"import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{server}/k').read())")
        assert reply["status"] == "ok" and "hello /k" in stream_text(msgs), msgs
        reply, msgs = execute(kc, f"import socket\nsocket.create_connection(('127.0.0.4', {server}))")
        assert reply["status"] == "error" and reply["ename"] == "PermissionError", reply
        text = stream_text(msgs, "stderr") + stream_text(msgs)
        assert f"127.0.0.4:{server} is not in the allow list" in text, msgs
        reply, msgs = execute(kc, "%sandbox network")
        assert "1 connection(s) allowed, 1 refused" in stream_text(msgs), msgs
        # the engine's own host lookups (the host's /etc/hosts, then its UDP query to the upstream
        # server) work under the engine process's seccomp
        reply, msgs = execute(kc, "import socket\nprint('pub', socket.gethostbyname('pub.test'))")
        assert "pub 93.184.216.34" in stream_text(msgs), msgs
        reply, msgs = execute(kc, """
import socket, struct
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(struct.pack(">HHHHHH", 9, 0x0100, 1, 0, 0, 0) + b"\\x09localhost\\x00\\x00\\x01\\x00\\x01", ("192.0.2.53", 53))
a = u.recv(512)
print("answer", a[3] & 15, socket.inet_ntoa(a[-4:]))
""")
        assert "answer 0 127.0.0.1" in stream_text(msgs), msgs
    resolver.close()


def test_a_malformed_policy_refuses_to_start_the_kernel() -> None:
    import subprocess

    from kernel_helpers import manager, wait_until
    km = manager("zeroboot", ZEROBOOT_NETWORK="pypi.org:https")
    km.start_kernel(stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: not km.is_alive(), 30), "a misconfigured kernel kept running"
        err = km.provisioner.process.stderr.read().decode()  # type: ignore[union-attr]
        assert "ZEROBOOT_NETWORK entry 'pypi.org:https'" in err and "1-65535" in err, err[-2000:]
    finally:
        km.cleanup_resources()


# ---- TLS, forks, interruptions, IPv6 ---------------------------------------------------------------

def _openssl(*args: str, cwd: str) -> None:
    import subprocess
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory) -> Iterator[tuple[int, str]]:
    """An HTTPS server on 127.0.0.1 with a certificate for data.test from a test CA: (port, CA PEM)."""
    import shutil
    import ssl
    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command to make a test CA")
    d = str(tmp_path_factory.mktemp("tls"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=zeroboot test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=data.test", cwd=d)
    with open(f"{d}/ext.cnf", "w") as f:
        f.write("subjectAltName=DNS:data.test,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
                "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.pem",
             "-days", "2", "-extfile", "ext.cnf", cwd=d)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(f"{d}/srv.pem", f"{d}/srv.key")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with open(f"{d}/ca.pem") as f:
        yield srv.server_address[1], f.read()
    srv.shutdown()
    srv.server_close()


def test_tls_works_unchanged_in_the_guest(template, tls_server) -> None:
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    port, ca = tls_server
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"data.test:{port}", "data.test=127.0.0.1"))
    s = Session(template)
    try:
        out = ok(s, f"""
import ssl, urllib.request
ctx = ssl.create_default_context(cadata={ca!r})
print(urllib.request.urlopen("https://data.test:{port}/secret", context=ctx).read())
try:
    urllib.request.urlopen("https://data.test:{port}/x")  # the system's CAs do not know the test CA
except urllib.error.URLError as exc:
    print("verify failed", "CERTIFICATE_VERIFY_FAILED" in str(exc))
""")
        assert "b'hello /secret'" in out and "verify failed True" in out, out
    finally:
        s.close()
        engine.set_network(None)


def test_a_fork_sees_its_parents_connection_as_reset(template, server) -> None:
    from zeroboot_kernel.native import Engine
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"127.0.0.1:{server}"))
    try:
        with template.fork() as sb:
            r = sb.execute(f"import socket\nconn = socket.create_connection(('127.0.0.1', {server}))")
            assert r.status == "ok", r
            with sb.fork() as child:
                r = child.execute("try:\n    conn.recv(1)\nexcept ConnectionResetError:\n    print('reset in the fork')")
                assert "reset in the fork" in r.stdout, r
            r = sb.execute("conn.sendall(b'GET /parent HTTP/1.0\\r\\n\\r\\n')\ndata = b''\n"
                           "while (c := conn.recv(4096)): data += c\nprint(data.endswith(b'hello /parent'))")
            assert "True" in r.stdout, r
    finally:
        engine.set_network(None)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts and never answers."""
    import socket
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    yield lsock.getsockname()[1]
    lsock.close()


def test_a_blocking_recv_is_interrupted_by_an_alarm_and_by_the_cell_timeout(template, silent_server) -> None:
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"127.0.0.1:{silent_server}"))
    s = Session(template, timeout=3)
    try:
        out = ok(s, f"""
import signal, socket
conn = socket.create_connection(("127.0.0.1", {silent_server}))
def ring(*_): raise TimeoutError("alarm")
signal.signal(signal.SIGALRM, ring)
signal.alarm(1)
try:
    conn.recv(10)
except TimeoutError:
    print("alarm interrupted recv")
""")
        assert "alarm interrupted recv" in out, out
        r = cell(s, "conn.recv(10)")  # blocks until the cell's time limit stops it
        assert r["status"] == "error" and "rolled back" in r["evalue"], r
        assert ok(s, "print(conn.fileno() > 0)").strip() == "True"
    finally:
        s.close()
        engine.set_network(None)


def test_so_rcvtimeo_and_so_sndtimeo_bound_a_blocking_call(template, silent_server) -> None:
    """SO_RCVTIMEO: a blocking recv from a server that never answers ends with EAGAIN after the
    timeout (and a zero timeout is none again); SO_SNDTIMEO reads back; a bad usec is EDOM."""
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"127.0.0.1:{silent_server}"))
    s = Session(template, timeout=60)
    try:
        out = ok(s, f"""
import errno, socket, struct, time
conn = socket.create_connection(("127.0.0.1", {silent_server}))
conn.settimeout(None)  # a blocking socket: only SO_RCVTIMEO can end the wait
tv = struct.pack("ll", 0, 300000)
conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 2, 500))
print("rcv", struct.unpack("ll", conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)))
print("snd", struct.unpack("ll", conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)))
t0 = time.monotonic()
try:
    conn.recv(10)
    print("recv returned")
except BlockingIOError as exc:
    print("recv", errno.errorcode[exc.errno], time.monotonic() - t0 >= 0.29)
try:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 1, 1000000))
except OSError as exc:
    print("bad usec", errno.errorcode[exc.errno])
conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
print("off", struct.unpack("ll", conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)))
""")
        assert "rcv (0, 300000)" in out and "snd (2, 500)" in out, out
        assert "recv EAGAIN True" in out and "bad usec EDOM" in out and "off (0, 0)" in out, out
    finally:
        s.close()
        engine.set_network(None)


class _TestResolver:
    """A DNS server on 127.0.0.1 (UDP) for the engine's host lookups (ZEROBOOT_NETWORK_RESOLVER):
    it answers A queries for names in `answers`, NXDOMAIN for "missing.*", and never answers the
    rest (a host resolver that hangs). It counts the queries it read."""

    def __init__(self, answers: dict[str, str]) -> None:
        import socket
        self.answers = answers
        self.crafted: dict[str, Any] = {}  # name -> f(id, question) -> the response datagram
        self.queries: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import socket
        while not self.stop.is_set():
            try:
                q, peer = self.sock.recvfrom(512)
            except socket.timeout:
                continue
            at, labels = 12, []
            while at < len(q) and q[at]:
                labels.append(q[at + 1:at + 1 + q[at]].decode())
                at += 1 + q[at]
            name = ".".join(labels)
            self.queries.append(name)
            question = q[12:at + 5]
            qtype = struct.unpack(">H", q[at + 1:at + 3])[0]
            if name in self.crafted:
                self.sock.sendto(self.crafted[name](q[:2], question), peer)
            elif name.startswith("missing."):
                self.sock.sendto(q[:2] + b"\x81\x83" + struct.pack(">HHHH", 1, 0, 0, 0) + question, peer)
            elif name in self.answers:
                records = b""
                if qtype == 1:  # a CNAME first (skipped by the engine), then the address
                    target = b"\x05alias\xc0\x0c"
                    records = b"\xc0\x0c" + struct.pack(">HHIH", 5, 1, 60, len(target)) + target
                    records += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + bytes(map(int, self.answers[name].split(".")))
                count = 2 if records else 0
                self.sock.sendto(q[:2] + b"\x81\x80" + struct.pack(">HHHH", 1, count, 0, 0) + question + records, peer)
            # else: never answer

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def test_host_lookups_ask_the_upstream_resolver_without_blocking_the_engine(template) -> None:
    """Allowed names the host map and /etc/hosts do not list are asked of the upstream DNS server
    (here a test server on loopback, never the host's nameserver) without the engine waiting: a
    server that never answers costs the guest its own resolver timeout (gaierror) while its other
    threads run, never the engine; NXDOMAIN and answers reach the guest; the addresses DNS gave
    are remembered for connect (a public one) or refused (loopback: rebinding)."""
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    resolver = _TestResolver({"pub.test": "93.184.216.34", "lo.test": "127.0.0.1"})
    engine = Engine.default()
    engine.set_network(network_policy.parse("*.test:9", resolver=f"127.0.0.1:{resolver.port}"))
    s = Session(template, timeout=120)
    try:
        out = ok(s, """
import socket, threading, time
print(f"pub {sorted({a[4][0] for a in socket.getaddrinfo('pub.test', 9, socket.AF_INET, socket.SOCK_STREAM)})}")
try:
    socket.getaddrinfo("missing.test", 9, socket.AF_INET)
except socket.gaierror as exc:
    print(f"missing {exc.errno == socket.EAI_NONAME}", flush=True)
result = []
def look():
    try:
        socket.getaddrinfo("hang.test", 9, socket.AF_INET)
        result.append("answered")
    except socket.gaierror as exc:
        result.append(exc.errno)
t = threading.Thread(target=look)
t.start()
ticks = 0
while t.is_alive() and ticks < 2000:  # this thread runs while the other one's lookup waits
    time.sleep(0.01)
    ticks += 1
t.join(30)
print(f"hang {result == [socket.EAI_AGAIN]} {ticks > 5}", flush=True)
try:
    socket.create_connection(("lo.test", 9), timeout=5)
except PermissionError:
    print("lo refused")
""")
        assert "pub ['93.184.216.34']" in out and "missing True" in out, out
        assert "hang True True" in out and "lo refused" in out, out
        # a blocking read of the resolver's socket: interrupted by an alarm, then SERVFAIL once
        # the engine's bound (5 s) passes with no answer from upstream
        out = ok(s, r'''
import signal, socket, struct
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect(("192.0.2.53", 53))
u.send(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05hang2\x04test\x00\x00\x01\x00\x01")
def ring(*_): raise TimeoutError("alarm")
signal.signal(signal.SIGALRM, ring)
signal.alarm(1)
try:
    u.recv(512)
    print("answered before the alarm")
except TimeoutError:
    print("alarm interrupted the lookup")
reply = u.recv(512)
print("reply id", hex(struct.unpack(">H", reply[:2])[0]), "rcode", reply[3] & 15)
''')
        assert "alarm interrupted the lookup" in out and "reply id 0x1234 rcode 2" in out, out
        assert engine.network_stats()["dns_host_timeouts"] >= 1
        assert {"pub.test", "missing.test", "hang.test", "lo.test", "hang2.test"} <= set(resolver.queries), resolver.queries
        st = engine.network_stats()
        assert st["dns_host_lookups"] >= 4, st
        assert "localhost" not in resolver.queries  # /etc/hosts names are answered from the file
    finally:
        s.close()
        engine.set_network(None)
        resolver.close()


def _a(addr: bytes, rdlen: int | None = None) -> bytes:
    return b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, len(addr) if rdlen is None else rdlen) + addr


HOSTILE_RESPONSES = {  # what an upstream server may send back: each is parsed within its bounds
    "short.test": lambda i, q: i,
    "no-qr.test": lambda i, q: i + b"\x01\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + q + _a(b"\x5d\xb8\xd8\x22"),
    "many-claimed.test": lambda i, q: i + b"\x81\x80" + struct.pack(">HHHH", 1, 65535, 0, 0) + q,
    "label-past-end.test": lambda i, q: i + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + q + b"\x3f" + b"a" * 10,
    "pointer-loop.test": lambda i, q: i + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + q + b"\xc0\x0c" * 2,
    "huge-rdlen.test": lambda i, q: i + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + q + _a(b"\x5d\xb8", 60000),
    "v6-in-a.test": lambda i, q: i + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + q + _a(bytes(16)),
    "truncated.test": lambda i, q: i + b"\x83\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + q + _a(b"\x5d\xb8\xd8\x22"),
    "servfail.test": lambda i, q: i + b"\x81\x82" + struct.pack(">HHHH", 1, 0, 0, 0) + q,
    "qd-bomb.test": lambda i, q: i + b"\x81\x80" + struct.pack(">HHHH", 65535, 1, 0, 0) + q,
    "hundred.test": lambda i, q: i + b"\x81\x80" + struct.pack(">HHHH", 1, 100, 0, 0) + q +
    b"".join(_a(bytes([93, 184, k // 256, k % 256])) for k in range(100)),
    "wrong-id.test": lambda i, q: bytes([i[0] ^ 0xff, i[1]]) + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + q +
    _a(b"\x5d\xb8\xd8\x22"),
}


def test_hostile_upstream_dns_responses_are_parsed_within_bounds(template) -> None:
    """Malformed, lying or oversized responses from the upstream server: each lookup ends in an
    error or at most 8 addresses of the right family, and the engine keeps serving."""
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    resolver = _TestResolver({})
    resolver.crafted.update(HOSTILE_RESPONSES)
    engine = Engine.default()
    engine.set_network(network_policy.parse("*.test:9", resolver=f"127.0.0.1:{resolver.port}"))
    s = Session(template, timeout=300)
    try:
        out = ok(s, f'''
import socket
for name in {sorted(HOSTILE_RESPONSES)!r}:
    try:
        got = sorted({{a[4][0] for a in socket.getaddrinfo(name, 9, socket.AF_INET, socket.SOCK_STREAM)}})
        print(name, "answered", len(got), all(a.count(".") == 3 for a in got))
    except socket.gaierror as exc:
        print(name, "error", exc.errno)
''')
        assert "zeroboot:" not in out, out  # getaddrinfo's UDP connects to sort 8 answers are not the user's
        lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
        assert set(lines) == set(HOSTILE_RESPONSES), out
        assert lines["hundred.test"] == "answered 8 True", out
        for name in ("short.test", "no-qr.test", "many-claimed.test", "label-past-end.test", "huge-rdlen.test",
                     "v6-in-a.test", "truncated.test", "servfail.test", "qd-bomb.test", "wrong-id.test",
                     "pointer-loop.test"):
            assert lines[name].startswith("error"), (name, out)
        assert "answered 8" in ok(s, "import socket\nprint('answered', len(socket.getaddrinfo('hundred.test', 9, "
                                     "socket.AF_INET, socket.SOCK_STREAM)))")
    finally:
        s.close()
        engine.set_network(None)
        resolver.close()


@pytest.mark.without_kvm
def test_resolver_setting() -> None:
    assert network_policy.parse("a.test", resolver="127.0.0.1:5353").resolver == ("127.0.0.1", 5353)
    assert network_policy.parse("a.test", resolver="[::1]:53").resolver == ("::1", 53)
    assert network_policy.parse("a.test", resolver="10.0.0.1").resolver == ("10.0.0.1", 53)
    p = network_policy.parse("a.test", resolver="127.0.0.1:5353")
    assert network_policy.NetworkPolicy.from_wire(p.to_wire()) == p and "127.0.0.1:5353" in p.describe()
    for bad in ("dns.example", "127.0.0.1:0", "127.0.0.1:70000", "1.2.3", "[::1]:x"):
        with pytest.raises(NetworkPolicyError, match="ZEROBOOT_NETWORK_RESOLVER"):
            network_policy.parse("a.test", resolver=bad)


def test_ipv6_loopback(template) -> None:
    import socket
    try:
        srv = http.server.ThreadingHTTPServer(("::1", 0), _Handler, bind_and_activate=False)
        srv.address_family = socket.AF_INET6
        srv.socket = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.server_bind()
        srv.server_activate()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"[::1]:{port}"))
    s = Session(template)
    try:
        out = ok(s, f"import urllib.request\nprint(urllib.request.urlopen('http://[::1]:{port}/six').read())")
        assert "b'hello /six'" in out, out
        r = cell(s, f"import socket\nsocket.create_connection(('::2', {port}))")
        assert r["status"] == "error" and f"[::2]:{port} is not in the allow list" in r["stdout"], r
    finally:
        s.close()
        engine.set_network(None)
        srv.shutdown()
        srv.server_close()


# ---- limits ----------------------------------------------------------------------------------------

@pytest.mark.without_kvm
def test_limit_settings() -> None:
    p = network_policy.from_env({"ZEROBOOT_NETWORK": "a.org", "ZEROBOOT_NETWORK_MAX_CONNECTIONS": "3",
                                 "ZEROBOOT_NETWORK_RATE": "2M"})
    assert (p.max_connections, p.rate) == (3, 2 << 20) and "3 connection(s) open at once" in p.describe()
    assert network_policy.NetworkPolicy.from_wire(p.to_wire()) == p
    assert network_policy.parse("a.org").max_connections == network_policy.DEFAULT_MAX_CONNECTIONS
    for env, words in (({"ZEROBOOT_NETWORK_MAX_CONNECTIONS": "many"}, "whole number"),
                       ({"ZEROBOOT_NETWORK_RATE": "fast"}, "bytes per second")):
        with pytest.raises(NetworkPolicyError, match=words):
            network_policy.from_env({"ZEROBOOT_NETWORK": "a.org", **env})


def test_connection_count_and_rate_limits_are_enforced(template, silent_server, server) -> None:
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    engine = Engine.default()
    engine.set_network(network_policy.parse("127.0.0.1:*", max_connections="3", rate="200K"))
    s = Session(template)
    try:
        r = cell(s, f"""
import socket
conns = [socket.create_connection(("127.0.0.1", {silent_server})) for _ in range(3)]
try:
    socket.create_connection(("127.0.0.1", {silent_server}))
except OSError as exc:
    print("fourth refused", exc.errno)
conns.pop().close()
conns.append(socket.create_connection(("127.0.0.1", {silent_server})))
print("after a close", len(conns))
for c in conns: c.close()
""")
        assert "fourth refused 24" in r["stdout"] and "after a close 3" in r["stdout"], r  # EMFILE
        assert "ZEROBOOT_NETWORK_MAX_CONNECTIONS" in r["stdout"], r
        # 600 KiB at 200 KiB/s, with one second's worth as the first burst: at least ~2 s, however
        # fast the host is (a lower bound: a loaded machine only makes it slower)
        out = ok(s, f"""
import time, urllib.request
t = time.monotonic()
n = 0
for _ in range(20):
    n += len(urllib.request.urlopen("http://127.0.0.1:{server}/" + "x" * 30000).read())
print("took", time.monotonic() - t, n)
""")
        took, n = out.split("took ", 1)[1].split()[:2]
        assert int(n) > 600_000 and float(took) >= 1.8, out
        assert engine.network_stats()["throttled_ns"] > 1_000_000_000
    finally:
        s.close()
        engine.set_network(None)


def test_hostile_socket_arguments_fail_cleanly(net_session, server) -> None:
    """Raw syscalls with bad lengths, pointers, families and counts: errors as Linux gives them,
    never a crash of the engine; other families and types stay refused under a policy."""
    out = ok(net_session, f"""
import ctypes, errno, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = dict(socket=41, connect=42, sendto=44, recvfrom=45, sendmsg=46, setsockopt=54, getsockopt=55, getsockname=51)
def sc(name, *args):
    r = libc.syscall(NR[name], *[ctypes.c_long(a) for a in args])
    return errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()) if r < 0 else r
fd = sc("socket", socket.AF_INET, socket.SOCK_STREAM, 0)
good = ctypes.create_string_buffer(struct.pack("<HH4s8x", socket.AF_INET, socket.htons({server}), socket.inet_aton("127.0.0.1")))
v6 = ctypes.create_string_buffer(28)
bad = 0x10
res = dict(
    long_addr=sc("connect", fd, ctypes.addressof(good), 4096),
    short_addr=sc("connect", fd, ctypes.addressof(good), 1),
    wild_addr=sc("connect", fd, bad, 16),
    wrong_family=sc("connect", fd, ctypes.addressof(v6), 16),
    send_unconnected=sc("sendto", fd, ctypes.addressof(good), 4, 0, 0, 0),
    recv_unconnected=sc("recvfrom", fd, ctypes.addressof(good), 4, 0, 0, 0),
    bad_flags=sc("sendto", fd, ctypes.addressof(good), 4, 0x40000000, 0, 0),
    short_opt=sc("setsockopt", fd, socket.IPPROTO_TCP, socket.TCP_NODELAY, ctypes.addressof(good), 1),
    unknown_opt=sc("setsockopt", fd, 12345, 1, ctypes.addressof(good), 4),
    wild_opt=sc("setsockopt", fd, socket.IPPROTO_TCP, socket.TCP_NODELAY, bad, 4),
    wild_name=sc("getsockname", fd, bad, bad),
)
res["connect"] = sc("connect", fd, ctypes.addressof(good), 16)
iov = ctypes.create_string_buffer(16 * 2000)
msg = ctypes.create_string_buffer(struct.pack("<QIxxxxQQQQi4x", 0, 0, ctypes.addressof(iov), 2000, 0, 0, 0))
res["iov_count"] = sc("sendmsg", fd, ctypes.addressof(msg), 0)
wild_iov = ctypes.create_string_buffer(struct.pack("<QQ", bad, 100))
msg = ctypes.create_string_buffer(struct.pack("<QIxxxxQQQQi4x", 0, 0, ctypes.addressof(wild_iov), 1, 0, 0, 0))
res["wild_iov"] = sc("sendmsg", fd, ctypes.addressof(msg), 0)
res["huge_len"] = sc("sendto", fd, 1 << 46, 1 << 40, 0, 0, 0)
for family, kind in ((socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_NETLINK, socket.SOCK_RAW),
                     (socket.AF_INET, socket.SOCK_RAW), (socket.AF_INET6, socket.SOCK_SEQPACKET), (socket.AF_UNIX, socket.SOCK_DGRAM)):
    res[f"socket {{family}} {{kind}}"] = sc("socket", family, kind, 0)
print("RESULT", res)
""")
    res = eval(out.split("RESULT ", 1)[1].strip())  # noqa: S307 - our own cell's dict of str/int
    assert res["long_addr"] == "EINVAL" and res["short_addr"] == "EINVAL" and res["wild_addr"] == "EFAULT", res
    assert res["wrong_family"] == "EAFNOSUPPORT" and res["send_unconnected"] == "EPIPE", res
    assert res["recv_unconnected"] == "ENOTCONN" and res["bad_flags"] in ("EOPNOTSUPP", "ENOTSUP"), res
    assert res["short_opt"] == "EINVAL" and res["unknown_opt"] == "ENOPROTOOPT" and res["wild_opt"] == "EFAULT", res
    assert res["wild_name"] == "EFAULT" and res["connect"] == 0, res
    assert res["iov_count"] == "EMSGSIZE" and res["wild_iov"] == "EFAULT" and res["huge_len"] == "EFAULT", res
    assert all(v == "EACCES" for k, v in res.items() if k.startswith("socket ")), res


class _KeepAliveHandler(_Handler):
    protocol_version = "HTTP/1.1"


def test_requests_keeps_its_pooled_connection_and_reconnects_after_a_rewind(template) -> None:
    pytest.importorskip("requests")
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAliveHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"data.test:{port}", "data.test=127.0.0.1"))
    s = Session(template)
    try:
        ok(s, f"import requests\nss = requests.Session()\nprint(ss.get('http://data.test:{port}/one').text)")
        before = engine.network_stats()["connects"]
        assert "hello /two" in ok(s, f"print(ss.get('http://data.test:{port}/two').text)")
        assert engine.network_stats()["connects"] == before  # the pooled connection, kept across the checkpoint
        s.rewind(1)
        assert "hello /three" in ok(s, f"print(ss.get('http://data.test:{port}/three').text)")
        assert engine.network_stats()["connects"] == before + 1  # the restored copy was dropped, a new one made
    finally:
        s.close()
        engine.set_network(None)
        srv.shutdown()
        srv.server_close()


def _wheel_index(root, project: str = "zbtestpkg", value: int = 42) -> None:
    """A PEP 503 index of one hand-made wheel (PROJECT 0.1, PROJECT.VALUE == value) under root/simple/."""
    import base64
    import hashlib
    import zipfile
    name = f"{project}-0.1-py3-none-any.whl"
    info = f"{project}-0.1.dist-info"
    files = {f"{project}/__init__.py": f"VALUE = {value}\n".encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: 0.1\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}"
              for k, v in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    pkg = root / "simple" / project
    pkg.mkdir(parents=True)
    with zipfile.ZipFile(pkg / name, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    (pkg / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>')
    projects = sorted(p.name for p in (root / "simple").iterdir() if p.is_dir())
    (root / "simple" / "index.html").write_text(
        "<html><body>" + "".join(f'<a href="{p}/">{p}</a>' for p in projects) + "</body></html>")


def test_pip_in_the_cells_process_downloads_and_installs_from_an_allowed_index(template, tmp_path) -> None:
    """pip's own code, run in the cell (not `%pip`, which starts a process: issue 15)."""
    import functools
    _wheel_index(tmp_path)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None  # type: ignore[assignment]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    from zeroboot_kernel.native import Engine
    from zeroboot_kernel.session import Session
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"127.0.0.1:{port}"))
    s = Session(template)
    try:
        out = ok(s, f"""
import os, sys
from pip._internal.cli.main import main as pip
index = ["--no-cache-dir", "--disable-pip-version-check", "--index-url", "http://127.0.0.1:{port}/simple/"]
print("download", pip(["download", *index, "--no-deps", "-d", "/tmp/dl", "zbtestpkg"]), os.listdir("/tmp/dl"))
print("install", pip(["install", *index, "--target", "/tmp/site", "zbtestpkg"]))
sys.path.insert(0, "/tmp/site")
import zbtestpkg
print("imported", zbtestpkg.VALUE)
""")
        assert "download 0 ['zbtestpkg-0.1-py3-none-any.whl']" in out and "install 0" in out, out
        assert "imported 42" in out, out
    finally:
        s.close()
        engine.set_network(None)
        srv.shutdown()
        srv.server_close()


# ---- %pip in a notebook (guest/_zeroboot_agent/agent_pip.py; issues 15 and 17) -------------------

def _pip_session(template, folder):
    """A session whose notebook folder is `folder`, with none of this host's PIP_* settings (its
    find-links, index or config would change what pip does)."""
    import os
    from zeroboot_kernel.session import Session
    environ = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ")}
    return Session(template, project_dir=str(folder), environ=environ, timeout=600)


@pytest.mark.without_kvm
def test_pip_magic_arguments() -> None:
    """What %pip runs: --target the sandbox's site unless a location is named, option values are
    not requirements, and with no network a command that needs an index is refused before pip runs."""
    from zeroboot_guest._zeroboot_agent import agent_pip
    site = agent_pip.SANDBOX_SITE
    run, refusal = agent_pip.pip_args(["install", "-i", "http://127.0.0.1:1/simple/", "pkg"], True)
    assert refusal is None and run[:4] == ["install", "--target", site, "--disable-pip-version-check"], run
    run, refusal = agent_pip.pip_args(["install", "--user", "pkg"], True)
    assert "--target" not in run and refusal is None
    run, refusal = agent_pip.pip_args(["install", "--target=/tmp/x", "pkg"], True)
    assert run.count("--target=/tmp/x") == 1 and "--target" not in run
    run, refusal = agent_pip.pip_args(["download", "-d", "/tmp/dl", "pkg"], True)
    assert "--target" not in run and refusal is None
    for args in (["install", "pandas"], ["install", "-r", "reqs.txt", "numpy"], ["download", "pkg"], ["install"]):
        run, refusal = agent_pip.pip_args(args, False)
        assert refusal and "ZEROBOOT_NETWORK" in refusal and "--find-links" in refusal and "template" in refusal, args
    assert "pandas" in agent_pip.pip_args(["install", "pandas"], False)[1]
    for args in (["install", "./x.whl"], ["install", "--no-index", "--find-links", "./w", "pkg"],
                 ["install", "-f", "w", "pkg"], ["list"], ["install", "-r", "reqs.txt"]):
        run, refusal = agent_pip.pip_args(args, False)
        assert refusal is None, args
    assert agent_pip.pip_args(["install", "./x.whl"], False)[0][1:6] == \
        ["--target", site, "--retries", "0", "--disable-pip-version-check"]


def test_pip_magic_installs_local_wheels_without_network(template, tmp_path) -> None:
    """`%pip install ./x.whl` and `%pip install --no-index --find-links ./wheels pkg` with no
    network policy: into the sandbox's site-packages, importable in the next cell and in a child
    Python; a rewind to before the install removes it; an index package is refused with the ways out."""
    _wheel_index(tmp_path, "zbwheela", 7)
    _wheel_index(tmp_path, "zbwheelb", 8)
    s = _pip_session(template, tmp_path)
    try:
        out = ok(s, "%pip install ./simple/zbwheela/zbwheela-0.1-py3-none-any.whl")
        assert "Successfully installed zbwheela-0.1" in out and "sandbox's site-packages" in out, out
        assert ok(s, "import zbwheela; print('a', zbwheela.VALUE)").strip() == "a 7"
        out = ok(s, "%pip install --no-index --find-links ./simple/zbwheelb zbwheelb")
        assert "Successfully installed zbwheelb-0.1" in out, out
        out = ok(s, "import sys, subprocess\nprint(subprocess.run([sys.executable, '-c', "
                    "'import zbwheela, zbwheelb; print(zbwheela.VALUE + zbwheelb.VALUE)'], "
                    "capture_output=True, text=True).stdout)")
        assert out.strip() == "15", out
        out = ok(s, "%pip install zbtestpkg-not-here")
        assert "needs a package index for zbtestpkg-not-here" in out and "ZEROBOOT_NETWORK" in out, out
        assert "Processing" not in out and ok(s, "print(_exit_code)").strip() == "1"
        s.rewind(4)  # back to before the second install: its files are gone with it
        r = cell(s, "import zbwheelb")
        assert r["status"] == "error" and r["ename"] == "ModuleNotFoundError", r
        assert ok(s, "import zbwheela; print(zbwheela.VALUE)").strip() == "7"
    finally:
        s.close()


def test_pip_magic_installs_from_an_allowed_local_index(template, tmp_path) -> None:
    """`%pip install --index-url http://127.0.0.1:PORT/simple/ pkg` through the network policy."""
    import functools
    _wheel_index(tmp_path)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None  # type: ignore[assignment]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    from zeroboot_kernel.native import Engine
    engine = Engine.default()
    engine.set_network(network_policy.parse(f"127.0.0.1:{port}"))
    s = _pip_session(template, tmp_path / "simple")
    try:
        out = ok(s, f"%pip install --no-cache-dir --index-url http://127.0.0.1:{port}/simple/ zbtestpkg")
        assert "Successfully installed zbtestpkg-0.1" in out, out
        assert ok(s, "import zbtestpkg; print(zbtestpkg.VALUE)").strip() == "42"
        assert engine.network_stats()["connects"] >= 1
    finally:
        s.close()
        engine.set_network(None)
        srv.shutdown()
        srv.server_close()


def test_bench_network_quick(template, tmp_path) -> None:
    """`bench network --quick` (CI's size; the default is issue 17's 200 MB): both readers, guest
    and host, in one run, with the byte counts checked inside."""
    from zeroboot_kernel.bench import network as bench_network
    out = tmp_path / "network.json"
    assert bench_network.main(["--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert res["size_mb"] == bench_network.QUICK_MB and len(rows) == 2 and all(r["guest_mb_s"] > 0 and r["host_mb_s"] > 0 for r in rows.values()), res
    with pytest.raises(SystemExit):
        bench_network.main(["--size-mb", "0"])
