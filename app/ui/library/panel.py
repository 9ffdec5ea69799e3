"""The "Model library" dock: curated pairs with their fit on this machine and their downloads, the GGUF
files on this machine (import one), the pair to load with its pairing verdict, and loading it into the
running engine; each section is its own widget, laid out and wired here."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QDockWidget, QGroupBox, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.catalog import curated
from app.catalog.library import Library
from app.config import ModelsSettings
from app.services.client import EngineClient
from app.services.library.catalog import CatalogModel
from app.services.library.fit_scan import FitScan
from app.services.library.local_models import LocalModels
from app.ui import theme
from app.ui.library.catalog_table import CatalogTable
from app.ui.library.downloads import DownloadControls
from app.ui.library.local_files import LocalFiles
from app.ui.library.pair_loader import PairLoader
from app.ui.library.pair_picker import PairPicker
from app.ui.panel import scrolled


class LibraryPanel(QDockWidget):
    """The library's models (`catalog`, `local`, `fit_scan`) and its sections (`catalog_table`,
    `downloads`, `local_files`, `picker`, `loader`); `message` says how the last import, download or load
    went."""

    def __init__(
        self,
        client: EngineClient,
        models_dir: Path,
        catalog: Path | None = None,
        token: str | None = None,
        endpoint: str | None = None,
        include_hf_cache: bool = True,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__("Model library", parent)
        self.setObjectName("model-library")
        self.library = Library(models_dir)
        self.models_dir = Path(models_dir)
        self.catalog_file = catalog
        self.catalog = CatalogModel(curated.load(catalog), self.models_dir, token, endpoint, self)
        self.local = LocalModels(self.library, include_hf_cache, self)
        self.fit_scan = FitScan(self)
        self.catalog_table = CatalogTable(self.catalog, self.fit_scan)
        self.downloads = DownloadControls(self.catalog)
        self.local_files = LocalFiles(self.local, self.library)
        self.picker = PairPicker(self.local)
        self.loader = PairLoader(client)
        self.message = QLabel("", wordWrap=True)
        self._lay_out()
        self._wire()
        self.picker.fill()

    @classmethod
    def from_settings(
        cls, client: EngineClient, models: ModelsSettings, token: str | None, parent: QWidget | None = None
    ) -> LibraryPanel:
        """The panel on the models folder, catalog and Hugging Face cache that `models` name."""
        catalog = Path(models.catalog).expanduser() if models.catalog else None
        return cls(client, models.folder(), catalog, token, include_hf_cache=models.hf_cache, parent=parent)

    def _lay_out(self) -> None:
        catalog_box = QGroupBox("Curated pairs")
        catalog_layout = QVBoxLayout(catalog_box)
        catalog_layout.addWidget(self.catalog_table, 1)
        catalog_layout.addWidget(self.downloads)
        local_box = QGroupBox(f"On this computer ({self.models_dir})")
        QVBoxLayout(local_box).addWidget(self.local_files)
        self.use_box = QGroupBox("Load into the engine")
        use_layout = QVBoxLayout(self.use_box)
        use_layout.addWidget(self.picker)
        use_layout.addWidget(self.loader)
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.addWidget(catalog_box, 3)
        layout.addWidget(local_box, 2)
        layout.addWidget(self.use_box)
        layout.addWidget(self.message)
        self.setWidget(scrolled(body))

    def _wire(self) -> None:
        self.catalog_table.pairSelected.connect(self._pair_selected)
        self.catalog.downloaded.connect(self._downloaded)
        self.downloads.download_button.clicked.connect(lambda: self.message.setText(""))
        self.local.scanned.connect(self._scanned)
        self.local_files.info.connect(self._info)
        self.local_files.error.connect(self._error)
        self.local_files.imported.connect(lambda path: self.picker.want({"target": str(path)}))
        self.picker.changed.connect(lambda: self.loader.set_pair(self.picker.picked()))
        self.loader.loadFailed.connect(
            lambda message: self._error(f"The engine could not load the pair: {message}")
        )

    # --- what the window asks ---------------------------------------------------------------------

    def start_scan(self) -> None:
        """Size every pair for this machine's devices (a child process) for the fit badges."""
        self.catalog_table.size_for_machine(self.models_dir, self.catalog_file)

    def refresh(self) -> None:
        """Read the models folder again (a scan on a worker thread)."""
        self.local.scan()

    def engine_ready(self) -> None:
        self.loader.engine_ready()

    def engine_stopped(self) -> None:
        self.loader.engine_stopped()

    def open_section(self, section: str = "") -> None:
        """Show the panel over its tabs; `section` "images" opens it on the pair to load with its "Images"
        choice (a vision projector) in view and focus."""
        self.show()
        self.raise_()
        if section == "images":
            area = self.widget()
            if isinstance(area, QScrollArea):
                area.ensureWidgetVisible(self.use_box)
            self.picker.projector_choice.setFocus()

    def wait(self, timeout: float = 30.0) -> None:
        """Join the worker threads (scans, imports, verdicts, downloads): for tests and shutdown."""
        self.local_files.wait(timeout)
        self.picker.wait(timeout)
        self.catalog.wait(timeout)

    # --- between the sections ---------------------------------------------------------------------

    def _pair_selected(self, pair_id: str | None) -> None:
        if pair_id is not None and (paths := self.catalog.installed(pair_id)):
            self.picker.choose(paths["target"], paths["drafter"], paths.get("mmproj"))
        self.downloads.show_pair(pair_id)

    def _downloaded(self, pair_id: str, _paths: list) -> None:
        self._info(f"{self.catalog.pair(pair_id).name} is downloaded and verified.")
        paths = self.catalog.installed(pair_id)
        if paths:
            self.picker.want(
                {
                    "target": str(paths["target"]),
                    "drafter": str(paths["drafter"]),
                    "mmproj": str(paths["mmproj"]) if "mmproj" in paths else None,
                }
            )
        self.local.scan()

    def _scanned(self) -> None:
        self.catalog.refresh_installed()
        self.picker.fill()
        self.downloads.update_buttons()

    def _error(self, text: str) -> None:
        self.message.setStyleSheet(theme.error_text(self))
        self.message.setText(text)

    def _info(self, text: str) -> None:
        self.message.setStyleSheet("")
        self.message.setText(text)
