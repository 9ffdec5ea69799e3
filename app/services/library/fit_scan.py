"""Every curated pair's fit on this machine, sized by the CLI in a child process."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.services.engine import AppCommand

FIT_TIMEOUT_MS = 120_000


class FitScan(AppCommand):
    """`python -m app models list --json` in a child process: every pair's fit badge, placement and
    per-device summary, exactly as the CLI computes them (the device probes load GPU drivers, which stay
    out of the window's process, as with `DeviceScan`)."""

    scanned = Signal(dict)  # pair id -> {"badge", "placement", "devices", "installed"}
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(FIT_TIMEOUT_MS, parent)

    def start(self, models_dir: Path, catalog: Path | None = None) -> None:
        env = {"FORESIGHT_MODELS__DIR": str(models_dir)}
        if catalog is not None:
            env["FORESIGHT_MODELS__CATALOG"] = str(catalog)
        self._run(["models", "list", "--json"], env)

    def _result(self, code: int, out: str, err: str) -> None:
        try:
            rows = json.loads(out)["pairs"]
        except (ValueError, KeyError, TypeError):
            last = err.splitlines()[-1] if err else "no output"
            self.failed.emit(f"could not size the pairs for this machine (exit code {code}): {last}")
            return
        self.scanned.emit({r["id"]: {**r["fit"], "installed": r["installed"]} for r in rows})
