"""The local models' list (app.services.library.local_models) never misses a file imported while it scans."""

from __future__ import annotations

import threading
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.catalog.library import Library, LocalModel
from app.services.library.local_models import LocalModels


class _HeldLibrary(Library):
    """The real library whose first scan waits until released: a scan that outlasts an import, as on a busy
    machine or with a large Hugging Face cache."""

    def __init__(self, models_dir: Path) -> None:
        super().__init__(models_dir)
        self.release = threading.Event()
        self.scans = 0

    def scan(self, include_hf_cache: bool = True) -> list[LocalModel]:
        self.scans += 1
        found = super().scan(include_hf_cache=False)
        if self.scans == 1:
            assert self.release.wait(60)
        return found


def test_a_file_imported_while_a_scan_runs_is_listed(qtbot: QtBot, tmp_path: Path, gemma_path: Path) -> None:
    library = _HeldLibrary(tmp_path / "models")
    models = LocalModels(library, include_hf_cache=False)
    models.scan()  # the first scan starts before the import is registered...
    library.import_file(gemma_path)
    models.scan()  # ...and the import asks again while it still runs
    library.release.set()
    wanted = str(gemma_path.resolve())
    qtbot.waitUntil(lambda: wanted in [str(m.path) for m in models.usable()], timeout=30_000)
    assert library.scans == 2  # the running scan, then the one asked for meanwhile
