"""Device discovery for the window: `python -m app devices --json` in a child process.

The probes load GPU drivers, which may hang or crash; a child keeps that away from the window, and the
window stays responsive while it runs.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QObject, QProcess, QTimer, Signal

from app.services.engine import app_command

SCAN_TIMEOUT_MS = 60_000


class DeviceScan(QObject):
    scanned = Signal(dict)  # {"devices": [...], "placement": {...}}
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._proc: QProcess | None = None
        self._timer = QTimer(self, singleShot=True, interval=SCAN_TIMEOUT_MS, timeout=self._timeout)

    @property
    def running(self) -> bool:
        return self._proc is not None

    def start(self, target: str | None = None) -> None:
        if self._proc is not None:
            return
        program, args = app_command(["devices", "--json", *(["--target", target] if target else [])])
        proc = QProcess(self)
        proc.finished.connect(self._finished)
        self._proc = proc
        proc.start(program, args)
        self._timer.start()

    def _timeout(self) -> None:
        if self._proc is not None:
            self._proc.kill()

    def _finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        proc, self._proc = self._proc, None
        self._timer.stop()
        if proc is None:
            return
        out = bytes(proc.readAllStandardOutput()).decode("utf-8", errors="replace")
        err = bytes(proc.readAllStandardError()).decode("utf-8", errors="replace").strip()
        proc.deleteLater()
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
