"""The curated pairs' table, and how the selected pair fits this machine's devices."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QItemSelectionModel, Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.services.library.catalog import CatalogModel
from app.services.library.fit_scan import FitScan
from app.services.library.table import PAIR_ROLE
from app.ui.library.tables import library_table


class CatalogTable(QWidget):
    """The catalog's rows with their fit badges; above them, the placement reason and per-device summary of
    the selected pair (sized by `fit_scan`). `pairSelected` carries the selected pair's id, or None."""

    pairSelected = Signal(object)

    def __init__(self, catalog: CatalogModel, fit_scan: FitScan, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.catalog = catalog
        self.fit_scan = fit_scan
        self.machine = QLabel("Checking this machine's memory…", wordWrap=True)
        self.view = library_table(catalog)
        self.view.selectionModel().selectionChanged.connect(lambda *_: self._selected())
        fit_scan.scanned.connect(self._fits)
        fit_scan.failed.connect(lambda message: self.machine.setText(f"Fit unknown: {message}"))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.machine)
        layout.addWidget(self.view, 1)

    def size_for_machine(self, models_dir: Path, catalog_file: Path | None) -> None:
        """Size every pair for this machine's devices (a child process) for the fit badges."""
        self.machine.setText("Checking this machine's devices and memory…")
        self.fit_scan.start(models_dir, catalog_file)

    def selected_pair(self) -> str | None:
        rows = self.view.selectionModel().selectedRows()
        return self.catalog.data(rows[0], PAIR_ROLE) if rows else None

    def select_pair(self, pair_id: str) -> None:
        index = self.catalog.index(self.catalog.row_of(pair_id), 0)
        self.view.selectionModel().select(
            index,
            QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows,
        )

    def _selected(self) -> None:
        self._show_fit()
        self.pairSelected.emit(self.selected_pair())

    def _fits(self, fits: dict) -> None:
        self.catalog.set_fits(fits)
        self._show_fit()

    def _show_fit(self) -> None:
        found = self.catalog.fits.get(self.selected_pair() or "")
        if found is None:
            ready = bool(self.catalog.fits)
            self.machine.setText(
                "Select a pair to see how it fits each device." if ready else self.machine.text()
            )
            return
        self.machine.setText("\n".join([found["placement"]["reason"], *found["devices"]]))
