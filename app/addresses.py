"""Network addresses as the user writes them: host:port endpoints, and which hosts are loopback."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

RPC_PORT = 50052  # rpc-server's own default: a worker's port unless the user picks another


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """localhost (any case, a final dot allowed), or an address of 127.0.0.0/8 or ::1 (bracketed or not)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_endpoint(text: str) -> Endpoint:
    """host:port (IPv6 as [::1]:port); ValueError names what is wrong."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port (e.g. 192.168.1.20:{RPC_PORT})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:{RPC_PORT}")
    return Endpoint(host, int(port))


def parse_endpoints(text: str) -> list[Endpoint]:
    """`host:port[,host:port...]` in order, each once; empty text: none."""
    out: list[Endpoint] = []
    for part in text.split(","):
        if part.strip():
            endpoint = parse_endpoint(part)
            if endpoint not in out:
                out.append(endpoint)
    return out
