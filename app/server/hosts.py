"""Which Host headers a listener answers to (DNS-rebinding protection), and which binds are loopback."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable

from app.addresses import is_loopback

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
# Documentation addresses (RFC 5737, RFC 3849): connecting a UDP socket sends nothing, but makes the
# kernel pick the source address of the default route, i.e. the machine's LAN address.
_ROUTE_PROBES = (("192.0.2.1", socket.AF_INET), ("2001:db8::1", socket.AF_INET6))


def as_host(name: str) -> str:
    """A name or address as a Host header spells it: lower case, IPv6 in brackets, no zone, no final dot."""
    name = name.strip().lower().strip("[]").split("%", 1)[0]
    return f"[{name}]" if ":" in name else name.rstrip(".")


def host_name(header: str) -> str:
    """The Host header without its port: 'LocalHost:8080' -> 'localhost', '[::1]:80' -> '[::1]'."""
    host = header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else ""
    if host.count(":") > 1:
        return ""  # an unbracketed IPv6 address is not a valid Host
    return host.partition(":")[0].rstrip(".")


def machine_names() -> set[str]:
    """This machine's names and LAN addresses: hostname, FQDN, their addresses, the default-route address."""
    hostname = socket.gethostname()
    names = {hostname, f"{hostname.partition('.')[0]}.local"}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn())
    for name in list(names):
        with contextlib.suppress(OSError, UnicodeError):
            names.update(str(info[4][0]) for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM))
    for probe, family in _ROUTE_PROBES:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.connect((probe, 9))
            names.add(udp.getsockname()[0])
    return {as_host(name) for name in names if name}


def allowed_hosts(bind: str, api_key: bool, lan_names: Iterable[str] = ()) -> frozenset[str]:
    """The Host names (without port) that a listener bound to `bind` answers to.

    Loopback names and addresses always, and the bound address itself; with an API key and a bind that
    is not loopback, also `lan_names` (from machine_names()). Any other name is what a DNS-rebinding
    page would send, and is refused.
    """
    allowed = set(LOOPBACK_NAMES)
    if bind.strip("[]") not in WILDCARD_BINDS:
        allowed.add(as_host(bind))
    if api_key and not is_loopback(bind):
        allowed.update(as_host(name) for name in lan_names)
    return frozenset(allowed)
