"""The GGUF files on this computer: their table, importing one, and reading the folder again."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from app.catalog.library import Library
from app.services.library.background import Background, BackgroundJobs
from app.services.library.local_models import LocalModels
from app.ui.library.tables import library_table


class LocalFiles(QWidget):
    """The files `local` lists, with Import GGUF… and Look again; what happens is said through `info` and
    `error`, and `imported` carries the path of a file once the library holds it."""

    imported = Signal(object)  # the imported file's Path
    info = Signal(str)
    error = Signal(str)

    def __init__(self, local: LocalModels, library: Library, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.local = local
        self.library = library
        self.jobs = BackgroundJobs(self)
        self.view = library_table(local)
        self.import_button = QPushButton("Import GGUF…")
        self.import_button.clicked.connect(self._import_clicked)
        self.rescan_button = QPushButton("Look again")
        self.rescan_button.clicked.connect(local.scan)
        local.failed.connect(lambda message: self.error.emit(f"Could not read the models folder: {message}"))
        buttons = QHBoxLayout()
        buttons.addWidget(self.import_button)
        buttons.addWidget(self.rescan_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view, 1)
        layout.addLayout(buttons)

    def import_file(self, path: Path, copy: bool = False) -> Background:
        """Register a GGUF file in the library (checked first; a bad file changes nothing)."""
        self.info.emit(f"Importing {path.name}…")
        job = self.jobs.job(lambda: self.library.import_file(path, copy=copy))
        job.done.connect(lambda model: self._imported(model.path))
        job.failed.connect(lambda message: self.error.emit(f"Could not import {path.name}: {message}"))
        return job.start()

    def wait(self, timeout: float | None = None) -> None:
        """Join the imports and the scan running."""
        self.jobs.wait(timeout)
        self.local.wait(timeout)

    def _import_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a GGUF model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.import_file(Path(path))

    def _imported(self, path: Path) -> None:
        self.info.emit(f"Imported {path.name}.")
        self.imported.emit(path)
        self.local.scan()
