"""The sandbox's network egress policy, from the kernel's own settings (docs/SECURITY.md, "Network").

    ZEROBOOT_NETWORK        none (the default: no socket but socketpair works), or a comma-separated
                            allow list of entries, each optionally with a port:
                              pypi.org              that host name (ports 80 and 443)
                              *.example.org         every name below example.org (not example.org)
                              127.0.0.1:8000        an address, on port 8000
                              10.0.0.0/8:*          a network, on any port
                              [::1]:8000            an IPv6 address (or [2001:db8::/32]:443) on a port
                              2001:db8::/32         IPv6 without a port (80 and 443)
                            Without a port an entry allows 80 and 443 (web traffic), `:*` any port.
    ZEROBOOT_NETWORK_HOSTS  name=address pairs, comma-separated: what the sandbox's resolver answers
                            for those names instead of asking the host's resolver (like /etc/hosts;
                            the names still need an entry in ZEROBOOT_NETWORK)
    ZEROBOOT_NETWORK_MAX_CONNECTIONS  connections open at once (default 64; 0: no limit)
    ZEROBOOT_NETWORK_RATE   bytes per second, sent and received together (10M, 512K; default 0: no limit)
    ZEROBOOT_NETWORK_RESOLVER  the DNS server (ADDRESS, ADDRESS:PORT, [V6]:PORT) the engine asks for
                            allowed names that neither the host map nor the host's /etc/hosts lists
                            (default: the first nameserver of the host's /etc/resolv.conf)

A name entry lets the guest resolve the name (through the engine's resolver, never its own) and
connect to the *public* addresses it resolved to; loopback, private and link-local addresses are
reached only through an address or network entry (no DNS rebinding), or the operator's own
ZEROBOOT_NETWORK_HOSTS answers. Parsed in the kernel process, sent to the engine process as JSON
(`to_wire`, re-checked there by `from_wire`), installed into the engine before its seccomp
lockdown. Nothing the guest sends reaches this module.
"""
from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from .errors import ZerobootError
from .sizes import parse_bytes

DEFAULT_PORTS = (80, 443)
DEFAULT_MAX_CONNECTIONS = 64
MAX_RULES = 256   # native/net.h ZB_NET_MAX_RULES
MAX_HOSTS = 256   # ZB_NET_MAX_HOSTS
RESOLVER = "192.0.2.53"  # native/net.h ZB_NET_RESOLVER_V4: the guest's /etc/resolv.conf names it
_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,63}$")

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


class NetworkPolicyError(ZerobootError):
    """ZEROBOOT_NETWORK or ZEROBOOT_NETWORK_HOSTS has a value the kernel cannot use."""


@dataclass(frozen=True)
class Rule:
    kind: str                 # "name", "suffix" or "cidr"
    port: int                 # 1-65535, 0 = any port
    name: str = ""            # name, or the suffix without "*."
    network: Network | None = None

    def text(self) -> str:
        port = "*" if not self.port else str(self.port)
        if self.kind == "name":
            return f"{self.name}:{port}"
        if self.kind == "suffix":
            return f"*.{self.name}:{port}"
        assert self.network is not None
        net = str(self.network.network_address) if self.network.prefixlen == self.network.max_prefixlen else str(self.network)
        return f"[{net}]:{port}" if self.network.version == 6 else f"{net}:{port}"


@dataclass(frozen=True)
class NetworkPolicy:
    rules: tuple[Rule, ...] = ()
    hosts: tuple[tuple[str, str], ...] = ()   # (name, address)
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # open at once; 0: no limit
    rate: int = 0                             # bytes per second; 0: no limit
    resolver: tuple[str, int] | None = None   # (address, port) of the upstream DNS server; None: the host's

    @property
    def enabled(self) -> bool:
        return bool(self.rules)

    def describe(self) -> str:
        """What `%sandbox network` prints."""
        if not self.enabled:
            return ("network: none: the sandbox has no network (socket() fails with EACCES).\n"
                    "An operator enables egress with ZEROBOOT_NETWORK in the kernelspec's env (README, "
                    "\"Network access\"); a cell cannot change it.\n")
        lines = [f"network: {len(self.rules)} allowed destination(s) (ZEROBOOT_NETWORK, read-only from cells):"]
        lines += [f"  {r.text()}" for r in self.rules]
        if self.hosts:
            lines.append("names the sandbox's resolver answers itself (ZEROBOOT_NETWORK_HOSTS):")
            lines += [f"  {name} = {addr}" for name, addr in self.hosts]
        rate = f"{self.rate} bytes/s" if self.rate else "no rate limit"
        lines.append(f"limits: {self.max_connections or 'any number of'} connection(s) open at once, {rate} "
                     f"(ZEROBOOT_NETWORK_MAX_CONNECTIONS, ZEROBOOT_NETWORK_RATE)")
        if self.resolver:
            lines.append(f"host lookups ask {_resolver_text(self.resolver)} (ZEROBOOT_NETWORK_RESOLVER)")
        lines.append("host names reach only the public addresses they resolve to; others need an address entry. "
                     "TCP only; no servers (bind/listen fail with EACCES).")
        return "\n".join(lines) + "\n"

    def to_wire(self) -> str:
        return json.dumps({"rules": [[r.kind, r.name, str(r.network) if r.network else "", r.port] for r in self.rules],
                           "hosts": [list(h) for h in self.hosts], "max_connections": self.max_connections,
                           "rate": self.rate, "resolver": list(self.resolver) if self.resolver else None})

    @classmethod
    def from_wire(cls, text: str) -> NetworkPolicy:
        """The engine process's copy of the kernel's policy, checked again field by field."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list) or not isinstance(data.get("hosts"), list):
            raise NetworkPolicyError("network policy from the kernel: expected {rules: [...], hosts: [...]}")
        rules = []
        for item in data["rules"]:
            if not (isinstance(item, list) and len(item) == 4 and item[0] in ("name", "suffix", "cidr")
                    and isinstance(item[1], str) and isinstance(item[2], str) and type(item[3]) is int):
                raise NetworkPolicyError(f"network policy from the kernel: bad rule {item!r}")
            kind, name, net, port = item
            _check_port(port, str(item))
            if kind == "cidr":
                rules.append(Rule("cidr", port, network=_network(net, net)))
            else:
                rules.append(Rule(kind, port, name=_hostname(name, name)))
        hosts = tuple(_host_entry(f"{h[0]}={h[1]}") if isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)
                      else _bad_host(h) for h in data["hosts"])
        conns, rate = data.get("max_connections"), data.get("rate")
        if not (type(conns) is int and type(rate) is int and 0 <= conns and 0 <= rate < 1 << 62):
            raise NetworkPolicyError(f"network policy from the kernel: bad limits {conns!r}, {rate!r}")
        resolver = data.get("resolver")
        if resolver is not None:
            if not (isinstance(resolver, list) and len(resolver) == 2 and isinstance(resolver[0], str)
                    and type(resolver[1]) is int):
                raise NetworkPolicyError(f"network policy from the kernel: bad resolver {resolver!r}")
            resolver = _resolver(_resolver_text((resolver[0], resolver[1])))
        return _bounded(cls(tuple(rules), hosts, max_connections=conns, rate=rate, resolver=resolver))


def _resolver_text(resolver: tuple[str, int]) -> str:
    address, port = resolver
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _resolver(text: str | None) -> tuple[str, int] | None:
    """ZEROBOOT_NETWORK_RESOLVER: ADDRESS, ADDRESS:PORT or [V6]:PORT (port 53 by default)."""
    text = (text or "").strip()
    if not text:
        return None
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([0-9.]+)(?::(\d{1,5}))?|([0-9A-Fa-f:]+)", text)
    why = "give an IP address, ADDRESS:PORT or [IPV6]:PORT (the DNS server the engine asks)"
    if not m:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_RESOLVER={text!r}: {why}")
    address = m.group(1) or m.group(3) or m.group(5)
    port = int(m.group(2) or m.group(4) or 53)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_RESOLVER={text!r}: {why}") from None
    if not 1 <= port <= 65535:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_RESOLVER={text!r}: port {port} is not 1-65535")
    return str(ip), port


def _bad_host(h: Any) -> tuple[str, str]:
    raise NetworkPolicyError(f"network policy from the kernel: bad host entry {h!r}")


def _bounded(policy: NetworkPolicy) -> NetworkPolicy:
    if len(policy.rules) > MAX_RULES:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK: {len(policy.rules)} rules, at most {MAX_RULES} (an entry "
                                 f"without a port counts twice: 80 and 443)")
    if len(policy.hosts) > MAX_HOSTS:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_HOSTS: at most {MAX_HOSTS} entries")
    if not 0 <= policy.max_connections <= 100_000:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_MAX_CONNECTIONS={policy.max_connections}: give 0 (no limit) to 100000")
    return policy


def _check_port(port: int, entry: str) -> None:
    if not 0 <= port <= 65535:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: port {port} is not 1-65535 (or * for any)")


def _hostname(name: str, entry: str) -> str:
    name = name.strip().rstrip(".").lower()
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: {name!r} is not a host name (letters, digits, "
                                 f"'-' and '_' in dot-separated labels), an address or a CIDR")
    return name


def _network(text: str, entry: str) -> Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: {text!r} is not an address or a CIDR "
                                 f"(e.g. 10.0.0.0/8, [2001:db8::/32]:443)") from None


def _looks_like_address(text: str) -> bool:
    return bool(re.match(r"^[0-9.]+(/\d+)?$", text)) or ":" in text


def _parse_port(text: str, entry: str) -> tuple[int, ...]:
    if text == "*":
        return (0,)
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: the port {text!r} is not 1-65535 or * (any port)")
    return (int(text),)


def _parse_entry(entry: str) -> list[Rule]:
    host = entry
    ports: tuple[int, ...] = DEFAULT_PORTS
    if entry.startswith("["):  # [v6 address or CIDR] with an optional :port
        end = entry.find("]")
        if end < 0:
            raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: missing ']' (write IPv6 as [::1]:8000)")
        host, rest = entry[1:end], entry[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: expected :PORT after ']'")
            ports = _parse_port(rest[1:], entry)
        net = _network(host, entry)
        if net.version != 6:
            raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: brackets are for IPv6 addresses")
        return [Rule("cidr", p, network=net) for p in ports]
    if entry.count(":") > 1:  # a bare IPv6 address or CIDR: no port possible
        return [Rule("cidr", p, network=_network(entry, entry)) for p in ports]
    if ":" in entry:
        host, port_text = entry.rsplit(":", 1)
        ports = _parse_port(port_text, entry)
    if host == "*" or host.startswith("*") and not host.startswith("*."):
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK entry {entry!r}: a wildcard is '*.' before a domain "
                                 f"(*.example.org); to allow every address write 0.0.0.0/0:* (and ::/0:*)")
    if host.startswith("*."):
        return [Rule("suffix", p, name=_hostname(host[2:], entry)) for p in ports]
    if _looks_like_address(host):
        return [Rule("cidr", p, network=_network(host, entry)) for p in ports]
    return [Rule("name", p, name=_hostname(host, entry)) for p in ports]


def _host_entry(item: str) -> tuple[str, str]:
    name, sep, addr = item.partition("=")
    if not sep:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_HOSTS entry {item!r}: write name=address (data.test=127.0.0.1)")
    try:
        address = ipaddress.ip_address(addr.strip().strip("[]"))
    except ValueError:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_HOSTS entry {item!r}: {addr.strip()!r} is not an IP address") from None
    return _hostname(name, item), str(address)


def _limits(max_connections: str | None, rate: str | None) -> tuple[int, int]:
    conns = (max_connections or "").strip() or str(DEFAULT_MAX_CONNECTIONS)
    if not conns.isdigit():
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_MAX_CONNECTIONS={conns!r}: give a whole number (0: no limit)")
    text = (rate or "").strip() or "0"
    per_second = 0 if text.lower() == "none" else parse_bytes(text.removesuffix("/s"))
    if per_second is None:
        raise NetworkPolicyError(f"ZEROBOOT_NETWORK_RATE={text!r}: give bytes per second such as 10M or 512K "
                                 f"(0 or none: no limit)")
    return int(conns), per_second


def parse(value: str | None, hosts: str | None = None, max_connections: str | None = None,
          rate: str | None = None, resolver: str | None = None) -> NetworkPolicy:
    """The policy of ZEROBOOT_NETWORK (with ZEROBOOT_NETWORK_HOSTS, the limits and the upstream
    resolver); NetworkPolicyError says what to fix."""
    conns, per_second = _limits(max_connections, rate)
    upstream = _resolver(resolver)
    text = (value or "").strip()
    host_items = tuple(_host_entry(h.strip()) for h in (hosts or "").split(",") if h.strip())
    if not text or text.lower() == "none":
        if host_items:
            raise NetworkPolicyError("ZEROBOOT_NETWORK_HOSTS is set but ZEROBOOT_NETWORK is none: the sandbox has no "
                                     "network, so the host map would never be used (set both, or neither)")
        return NetworkPolicy()
    rules: list[Rule] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            raise NetworkPolicyError(f"ZEROBOOT_NETWORK={text!r}: an empty entry (two commas in a row?)")
        if entry.lower() == "none":
            raise NetworkPolicyError("ZEROBOOT_NETWORK: 'none' cannot be combined with other entries")
        rules += [r for r in _parse_entry(entry) if r not in rules]
    return _bounded(NetworkPolicy(tuple(rules), host_items, max_connections=conns, rate=per_second, resolver=upstream))


def from_env(env: Mapping[str, str]) -> NetworkPolicy:
    return parse(env.get("ZEROBOOT_NETWORK"), env.get("ZEROBOOT_NETWORK_HOSTS"),
                 env.get("ZEROBOOT_NETWORK_MAX_CONNECTIONS"), env.get("ZEROBOOT_NETWORK_RATE"),
                 env.get("ZEROBOOT_NETWORK_RESOLVER"))
