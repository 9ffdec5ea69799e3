"""Device discovery for the window: `python -m app devices --json` in a child process.

The probes load GPU drivers, which may hang or crash; a child keeps that away from the window, and the
window stays responsive while it runs.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QObject, Signal

from app.services.engine import AppCommand

SCAN_TIMEOUT_MS = 60_000


class DeviceScan(AppCommand):
    scanned = Signal(dict)  # {"devices": [...], "placement": {...}}
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(SCAN_TIMEOUT_MS, parent)

    def start(self, target: str | None = None) -> None:
        self._run(["devices", "--json", *(["--target", target] if target else [])])

    def _result(self, code: int, out: str, err: str) -> None:
        try:
            data = json.loads(out)
        except ValueError:
            self.failed.emit(
                f"device discovery failed (exit code {code}): {err.splitlines()[-1:] or 'no output'}"
            )
            return
        self.scanned.emit(
            {"devices": merge_probes(data.get("probes", [])), "placement": data.get("placement", {})}
        )


def merge_probes(probes: list[dict]) -> list[dict]:
    """One row per device: several probes may see the same one (NVML and CuPy a GPU, llama.cpp and the
    CPU probe the processor); the first probe's figures win, the others fill in what it lacked."""
    rows: dict[tuple[str, str, int], dict] = {}
    for probe in probes:
        for d in probe.get("devices", []):
            key = (str(d.get("vendor", "")), str(d.get("kind", "")), int(d.get("index", 0)))
            row = rows.setdefault(key, {"source": probe.get("path", "")})
            for field, value in d.items():
                if not row.get(field):
                    row[field] = value
    return list(rows.values())


def probe_notes(probes: list[dict]) -> list[str]:
    """Why a probe found nothing (no driver, a library missing), for the window to show."""
    return [f"{p.get('path')}: {p['error']}" for p in probes if p.get("error")]
