"""The RPC workers of the window's engine: their list in the settings file (`[engine] rpc`), and each one's
answer (state, protocol, memory, round trip) from the devices command's remote probe, in a child process."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.addresses import parse_endpoints
from app.config import ConfigError, load_settings, save_settings
from app.devices.rpc import HANDSHAKE_TIMEOUT_S
from app.services.engine import AppCommand

CHECK_TIMEOUT_MS = 60_000 + int(HANDSHAKE_TIMEOUT_S * 1000) * 8  # every probe, and workers that time out


def saved_servers(file: Path | None = None) -> list[str]:
    """The workers the settings file names, in order (none from a file that does not load)."""
    try:
        return [str(e) for e in parse_endpoints(load_settings(file, environ={}).engine.rpc)]
    except ConfigError:
        return []


def save_servers(servers: list[str], file: Path | None = None) -> None:
    """Write the workers into the settings file (checked as the engine checks them: ValueError names one)."""
    text = ",".join(str(e) for e in parse_endpoints(",".join(servers)))
    settings = load_settings(file, environ={})
    save_settings(
        settings.model_copy(update={"engine": settings.engine.model_copy(update={"rpc": text})}), file
    )


class WorkerCheck(AppCommand):
    """Each worker's answer, from `python -m app devices --json --rpc ...` in a child (its remote probe)."""

    checked = Signal(list)  # one dict per worker: endpoint, state, version, devices, latency_ms, error
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(CHECK_TIMEOUT_MS, parent)

    def start(self, servers: list[str]) -> None:
        if not servers:
            self.checked.emit([])
            return
        self._run(["devices", "--json", "--rpc", ",".join(servers)])

    def _result(self, code: int, out: str, err: str) -> None:
        try:
            probes = json.loads(out)["probes"]
        except (ValueError, KeyError):
            self.failed.emit(f"the workers could not be checked (exit code {code}): {err.splitlines()[-1:]}")
            return
        remote = next((p for p in probes if p.get("path") == "remote"), {})
        self.checked.emit(remote.get("info", {}).get("servers", []))
