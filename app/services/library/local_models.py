"""The GGUF files on this machine as a table model, read on a worker thread."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from app.catalog.library import Library, LocalModel
from app.services.library.background import Background
from app.services.library.table import PAIR_ROLE, ModelIndex, TableModel, size_text


class LocalModels(TableModel):
    """The GGUF files `Library.scan()` found; `scan()` reads them on a worker thread."""

    COLUMNS = ("File", "Size", "Architecture", "Source", "Problem")
    scanned = Signal()
    failed = Signal(str)

    def __init__(
        self, library: Library, include_hf_cache: bool = True, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.library = library
        self.include_hf_cache = include_hf_cache
        self.models: list[LocalModel] = []
        self._scan: Background | None = None
        self._again = False  # a scan was asked for while one ran: it may have missed what changed since

    def rows(self) -> list[LocalModel]:
        return self.models

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        m = self.models[index.row()]
        if role == PAIR_ROLE:
            return str(m.path)
        if role == Qt.ItemDataRole.ToolTipRole:
            return str(m.path)
        if role == Qt.ItemDataRole.DisplayRole:
            return (m.path.name, size_text(m.size), m.architecture or "?", m.source, m.problem)[
                index.column()
            ]
        return None

    def usable(self) -> list[LocalModel]:
        """Text models that can be loaded (no mmproj, no unreadable file)."""
        return [m for m in self.models if not m.problem and not m.is_mmproj]

    def projectors(self) -> list[LocalModel]:
        """Vision projectors (mmproj files) that can be loaded with a target."""
        return [m for m in self.models if not m.problem and m.is_mmproj]

    @property
    def scanning(self) -> bool:
        return self._scan is not None and self._scan.running

    def scan(self) -> None:
        """List the library in a thread; asked while a scan runs (a file imported meanwhile), scan again
        when it ends, so nothing registered after the running scan began is missed."""
        if self.scanning:
            self._again = True
            return
        self._scan = Background(lambda: self.library.scan(include_hf_cache=self.include_hf_cache), self)
        self._scan.done.connect(self._scanned)
        self._scan.failed.connect(self.failed)
        self._scan.failed.connect(lambda _message: self._rescan_if_asked())
        self._scan.start()

    def _rescan_if_asked(self) -> None:
        if self._again:
            self._again = False
            self._scan = None
            self.scan()

    def wait(self, timeout: float | None = None) -> None:
        if self._scan is not None:
            self._scan.wait(timeout)

    def _scanned(self, models: list[LocalModel]) -> None:
        self.beginResetModel()
        self.models = models
        self.endResetModel()
        self.scanned.emit()
        self._rescan_if_asked()
