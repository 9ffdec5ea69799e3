"""Remote devices: the RPC workers' devices, probed in a child like the others, joined by the engine."""

from __future__ import annotations

from app.addresses import Endpoint, parse_endpoints
from app.devices import rpc
from app.devices.found import REMOTE, Device, ProbeResult
from app.devices.probe import join_llama_registry


def remote_devices(answers: list[rpc.RemoteServer], names: list[str] | None = None) -> list[Device]:
    """The ready workers' devices, named as llama.cpp names them once they join (RPC0, RPC1, ...)."""
    out: list[Device] = []
    for answer in answers:
        if answer.state != "ready":
            continue
        for memory in answer.devices:
            name = names[len(out)] if names else f"RPC{len(out)}"
            out.append(
                Device(
                    f"{name} ({answer.endpoint})", "rpc", REMOTE, memory["total_bytes"], memory["free_bytes"],
                    driver=f"RPC protocol {answer.version}", backends=["llama.cpp:RPC"], index=len(out),
                    endpoint=answer.endpoint, latency_ms=answer.latency_ms,
                )
            )  # fmt: skip
    return out


def probe_remote(servers: str) -> ProbeResult:
    """The RPC workers named (host:port, comma-separated): each one's handshake, devices and round trip."""
    result = ProbeResult(REMOTE)
    try:
        endpoints = parse_endpoints(servers)
    except ValueError as exc:
        result.error = str(exc)
        return result
    answers = rpc.check_all(endpoints)
    result.devices = remote_devices(answers)
    result.info["servers"] = [a.as_dict() for a in answers]
    problems = [a.error for a in answers if a.state != "ready"]
    if problems or not endpoints:
        result.error = "; ".join(problems) or "no worker named"
    return result


def attach(endpoints: list[Endpoint]) -> tuple[list[Device], list[str]]:
    """In the engine process: each worker's handshake (RemoteError names one that cannot serve, before
    llama.cpp would abort on it), then its devices join llama.cpp's registry; they are returned, with the
    names of this machine's GPUs."""
    answers = rpc.require_ready(endpoints)
    try:
        joined, here = join_llama_registry([str(e) for e in endpoints])
    except OSError as exc:
        raise rpc.RemoteError(str(exc)) from exc
    return remote_devices(answers, [name for e in endpoints for name in joined[str(e)]]), here
