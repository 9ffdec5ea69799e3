"""ggml-rpc workers seen from this machine: the protocol's handshake, device count and memory spoken from
Python, so that a worker that is down, busy or of another version is found out before llama.cpp connects
(its client aborts the whole process on any of those)."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from app.addresses import Endpoint

# The RPC protocol of the vendored llama.cpp (ggml/include/ggml-rpc.h of llama-cpp-python 0.3.36); a
# test reads it from the installed header. A server must have the same major and no newer minor.
RPC_PROTO = (7, 0, 0)
HANDSHAKE_TIMEOUT_S = 3.0
LATENCY_ROUNDS = 5
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE (ggml-rpc/transport.h): all zero from a plain TCP client
_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15


class RemoteError(Exception):
    """A worker that cannot serve: unreachable, busy, of another protocol version, or malformed."""


@dataclass
class RemoteServer:
    """What one worker answered: its protocol version, each device's memory, the round trip."""

    endpoint: str
    state: str = "unknown"  # ready, unreachable, busy, version mismatch, error
    version: str = ""
    devices: list[dict[str, int]] = field(default_factory=list)  # {"free_bytes", "total_bytes"} each
    latency_ms: float | None = None  # median round trip of a small request
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise RemoteError("the worker closed the connection")
        data += piece
    return bytes(data)


def _call(sock: socket.socket, cmd: int, payload: bytes, answer_size: int) -> bytes:
    # request: cmd (1 byte) | size (u64) | payload; answer: size (u64) | data
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != answer_size:
        raise RemoteError(f"malformed answer to command {cmd}: {size} bytes, not {answer_size}")
    return _recv_exact(sock, size)


def version_problem(version: tuple[int, int, int]) -> str:
    """Why a server of `version` cannot serve this client ("" when it can), as ggml-rpc's client checks."""
    if version[0] != RPC_PROTO[0] or version[1] > RPC_PROTO[1]:
        ours = ".".join(map(str, RPC_PROTO))
        theirs = ".".join(map(str, version))
        return (
            f"the worker speaks RPC protocol {theirs}, this Foresight speaks {ours}: run the same Foresight "
            "(or llama.cpp) version on both machines"
        )
    return ""


def hello(
    endpoint: Endpoint, timeout: float = HANDSHAKE_TIMEOUT_S, rounds: int = LATENCY_ROUNDS
) -> RemoteServer:
    """Handshake with one worker, read its devices' memory and time `rounds` round trips; never raises.

    rpc-server serves one client at a time: a worker already serving an engine accepts the connection
    but answers nothing until that client leaves, which reads here as "busy".
    """
    out = RemoteServer(str(endpoint))
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as exc:
        out.state, out.error = "unreachable", f"cannot connect to {endpoint}: {exc.strerror or exc}"
        return out
    with sock:
        try:
            answer = _call(sock, _CMD_HELLO, bytes(_CONN_CAPS), 4 + _CONN_CAPS)
        except TimeoutError:
            out.state = "busy"
            out.error = f"{endpoint} accepted but did not answer in {timeout:g} s: it serves another client"
            return out
        except (OSError, RemoteError) as exc:
            out.state, out.error = "error", f"{endpoint}: no RPC handshake ({exc}): is it an rpc-server?"
            return out
        version = (answer[0], answer[1], answer[2])
        out.version = ".".join(map(str, version))
        problem = version_problem(version)
        if problem:
            out.state, out.error = "version mismatch", problem
            return out
        try:
            (count,) = struct.unpack("<I", _call(sock, _CMD_DEVICE_COUNT, b"", 4))
            trips = []
            for device in range(count):
                t0 = time.perf_counter()
                free, total = struct.unpack(
                    "<QQ", _call(sock, _CMD_GET_DEVICE_MEMORY, struct.pack("<I", device), 16)
                )
                trips.append(time.perf_counter() - t0)
                out.devices.append({"free_bytes": free, "total_bytes": total})
            for _ in range(max(0, rounds - count)):
                t0 = time.perf_counter()
                _call(sock, _CMD_DEVICE_COUNT, b"", 4)
                trips.append(time.perf_counter() - t0)
        except (OSError, RemoteError) as exc:
            out.state, out.error = "error", f"{endpoint}: {exc}"
            return out
    if not out.devices:
        out.state, out.error = "error", f"{endpoint} has no device"
        return out
    trips.sort()
    out.latency_ms = round(trips[len(trips) // 2] * 1e3, 3)
    out.state = "ready"
    return out


def check_all(endpoints: list[Endpoint], timeout: float = HANDSHAKE_TIMEOUT_S) -> list[RemoteServer]:
    """Every worker's answer, in order (one after another: each costs a round trip or its timeout)."""
    return [hello(e, timeout) for e in endpoints]


def require_ready(endpoints: list[Endpoint], timeout: float = HANDSHAKE_TIMEOUT_S) -> list[RemoteServer]:
    """The workers' answers; RemoteError naming each one that cannot serve (llama.cpp would abort on it)."""
    answers = check_all(endpoints, timeout)
    bad = [a for a in answers if a.state != "ready"]
    if bad:
        raise RemoteError("; ".join(a.error for a in bad))
    return answers
