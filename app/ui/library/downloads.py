"""Download, Pause and Cancel for the pair selected in the catalog, with its progress and state."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.services.library.catalog import CatalogModel
from app.ui import theme


class DownloadControls(QWidget):
    """The buttons act on `pair_id` (the pair the catalog table has selected, shown with `show_pair`); a
    failed download's reason is said here, once, the table's row saying only that it failed."""

    def __init__(self, catalog: CatalogModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.catalog = catalog
        self.pair_id: str | None = None
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(lambda: self._act(self.catalog.download))
        self.pause_button = QPushButton("Pause")
        self.pause_button.clicked.connect(lambda: self._act(self.catalog.pause))
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(lambda: self._act(self.catalog.cancel))
        self.download_bar = QProgressBar(minimum=0, maximum=1000, textVisible=False)
        self.download_bar.hide()  # shown while a download runs or waits paused
        self.download_state = QLabel("", wordWrap=True)
        catalog.progressChanged.connect(self._progress_changed)
        buttons = QHBoxLayout()
        for b in (self.download_button, self.pause_button, self.cancel_button):
            buttons.addWidget(b)
        buttons.addWidget(self.download_bar, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.download_state)
        self.update_buttons()

    def show_pair(self, pair_id: str | None) -> None:
        """Act on `pair_id` (None: no pair) and show its download."""
        self.pair_id = pair_id
        self.update_buttons()
        if pair_id is None:
            self.download_bar.hide()
            self.download_state.setText("")
            return
        progress = self.catalog.progress.get(pair_id)
        if progress is not None and progress.total:
            self.download_bar.setValue(int(1000 * progress.done / progress.total))
        else:
            self.download_bar.setValue(0)
        state = self.catalog.states.get(pair_id)
        self.download_bar.setVisible(state in ("downloading", "paused"))
        text = self.catalog.state_text(pair_id)
        self.download_state.setText(f"Download {text}" if state == "failed" else text)
        self.download_state.setStyleSheet(theme.error_text(self) if state == "failed" else "")

    def update_buttons(self) -> None:
        pair_id = self.pair_id
        running = pair_id is not None and self.catalog.running(pair_id)
        paused = pair_id is not None and self.catalog.states.get(pair_id) == "paused"
        installed = pair_id is not None and self.catalog.installed(pair_id) is not None
        self.download_button.setText("Resume" if paused else "Download")
        self.download_button.setEnabled(pair_id is not None and not running and not installed)
        self.pause_button.setEnabled(running)
        self.cancel_button.setEnabled(running or paused)

    def _progress_changed(self, pair_id: str) -> None:
        if pair_id == self.pair_id:
            self.show_pair(pair_id)

    def _act(self, action: Callable[[str], None]) -> None:
        if self.pair_id is not None:
            action(self.pair_id)
        self.update_buttons()
