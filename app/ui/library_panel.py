"""The "Model library" panel: curated pairs with their fit on this machine and their downloads, the GGUF
files on this machine (import one), a pairing verdict, and loading a pair into the running engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelectionModel, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDockWidget,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.catalog import curated
from app.catalog.library import Library
from app.catalog.pairing import Verdict
from app.config import ModelsSettings
from app.services.client import EngineClient
from app.services.library import (
    PAIR_ROLE,
    Background,
    CatalogModel,
    FitScan,
    LoadStream,
    LocalModels,
    load_pair,
    read_verdict,
)
from app.ui import theme
from app.ui.panel import scrolled

NGRAM, NO_DRAFT = "ngram", "none"
NAME_WIDTH = 190
COLUMN_WIDTH = 120
MIN_COLUMN_WIDTH = 48
MIN_ROWS_SHOWN = 4  # a table keeps room for this many rows however the panel is squeezed


def _table(model: Any) -> QTableView:
    view = QTableView()
    view.setModel(model)
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    view.verticalHeader().hide()
    view.setWordWrap(False)
    view.setTextElideMode(Qt.TextElideMode.ElideRight)  # a long name is shortened, never clipped
    header = view.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)  # the user can widen a column
    header.setStretchLastSection(True)
    header.setDefaultSectionSize(COLUMN_WIDTH)
    header.setMinimumSectionSize(MIN_COLUMN_WIDTH)
    view.setMinimumHeight(view.verticalHeader().defaultSectionSize() * MIN_ROWS_SHOWN)
    model.modelReset.connect(lambda: _fit_columns(view))
    _fit_columns(view)
    return view


def _fit_columns(view: QTableView) -> None:
    """Columns as wide as their text, up to NAME_WIDTH for the first (the name) and COLUMN_WIDTH for the
    others: the rest elides, and the user can widen them."""
    for column in range(view.model().columnCount() - 1):
        view.resizeColumnToContents(column)
        widest = NAME_WIDTH if column == 0 else COLUMN_WIDTH
        view.setColumnWidth(column, min(view.columnWidth(column), widest))


class LibraryPanel(QDockWidget):
    loadStarted = Signal(object)  # the LoadStream of a pair being loaded (its stages, for the header)
    pairLoaded = Signal(dict)  # the engine's "ready" event: {"model", "draft", "context_length", ...}
    loadFailed = Signal(str)

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
        self.client = client
        self.library = Library(models_dir)
        self.models_dir = Path(models_dir)
        self.catalog_file = catalog
        self.catalog = CatalogModel(curated.load(catalog), self.models_dir, token, endpoint, self)
        self.local = LocalModels(self.library, include_hf_cache, self)
        self.fit_scan = FitScan(self)
        self.fit_scan.scanned.connect(self._fits)
        self.fit_scan.failed.connect(lambda message: self.machine.setText(f"Fit unknown: {message}"))
        self.verdict: Verdict | None = None
        self.load_stream: LoadStream | None = None
        # (target, drafter or None, n-gram, projector or None) being loaded, and the last one loaded
        self._loading: tuple[str, str | None, bool, str | None] = ("", None, False, None)
        self.loaded: tuple[str, str | None, bool, str | None] | None = None
        self._jobs: set[Background] = set()
        self._engine_up = False
        self._wanted: dict[str, str] | None = None  # paths to choose once the library scan shows them

        # catalog
        self.machine = QLabel("Checking this machine's memory…", wordWrap=True)
        self.catalog_view = _table(self.catalog)
        self.catalog_view.selectionModel().selectionChanged.connect(lambda *_: self._catalog_chosen())
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self._download_clicked)
        self.pause_button = QPushButton("Pause")
        self.pause_button.clicked.connect(lambda: self._act(self.catalog.pause))
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(lambda: self._act(self.catalog.cancel))
        self.download_bar = QProgressBar(minimum=0, maximum=1000, textVisible=False)
        self.download_bar.hide()  # shown while a download runs or waits paused
        self.download_state = QLabel("", wordWrap=True)
        self.catalog.progressChanged.connect(self._download_changed)
        self.catalog.downloaded.connect(self._downloaded)
        buttons = QHBoxLayout()
        for b in (self.download_button, self.pause_button, self.cancel_button):
            buttons.addWidget(b)
        buttons.addWidget(self.download_bar, 1)
        catalog_box = QGroupBox("Curated pairs")
        cv = QVBoxLayout(catalog_box)
        cv.addWidget(self.machine)
        cv.addWidget(self.catalog_view, 1)
        cv.addLayout(buttons)
        cv.addWidget(self.download_state)

        # local files
        self.local_view = _table(self.local)
        self.import_button = QPushButton("Import GGUF…")
        self.import_button.clicked.connect(self._import_clicked)
        self.rescan_button = QPushButton("Look again")
        self.rescan_button.clicked.connect(self.local.scan)
        self.local.scanned.connect(self._scanned)
        self.local.failed.connect(lambda message: self._error(f"Could not read the models folder: {message}"))
        local_buttons = QHBoxLayout()
        local_buttons.addWidget(self.import_button)
        local_buttons.addWidget(self.rescan_button)
        local_buttons.addStretch(1)
        local_box = QGroupBox(f"On this computer ({models_dir})")
        lv = QVBoxLayout(local_box)
        lv.addWidget(self.local_view, 1)
        lv.addLayout(local_buttons)

        # pair to load
        self.target_choice = QComboBox()
        self.drafter_choice = QComboBox()
        self.projector_choice = QComboBox()  # a vision projector for the target, or none
        self.target_choice.currentIndexChanged.connect(self._pair_changed)
        self.drafter_choice.currentIndexChanged.connect(self._pair_changed)
        self.verdict_label = QLabel("", wordWrap=True)
        self.use_button = QPushButton("Use this pair")
        self.use_button.clicked.connect(self.use_pair)
        self.load_bar = QProgressBar(minimum=0, maximum=0)  # busy: the engine reports stages, not shares
        self.load_bar.hide()
        self.load_state = QLabel("", wordWrap=True)
        form = QFormLayout()
        form.addRow("Target", self.target_choice)
        form.addRow("Drafts from", self.drafter_choice)
        form.addRow("Images", self.projector_choice)
        use_box = QGroupBox("Load into the engine")
        uv = QVBoxLayout(use_box)
        uv.addLayout(form)
        uv.addWidget(self.verdict_label)
        use_row = QHBoxLayout()
        use_row.addWidget(self.use_button)
        use_row.addWidget(self.load_bar, 1)
        uv.addLayout(use_row)
        uv.addWidget(self.load_state)

        self.message = QLabel("", wordWrap=True)
        body = QWidget()
        v = QVBoxLayout(body)
        v.addWidget(catalog_box, 3)
        v.addWidget(local_box, 2)
        v.addWidget(use_box)
        v.addWidget(self.message)
        self.use_box = use_box
        self.setWidget(scrolled(body))
        self._fill_choices()
        self._update_buttons()

    # --- machine and library --------------------------------------------------------------------

    @classmethod
    def from_settings(
        cls, client: EngineClient, models: ModelsSettings, token: str | None, parent: QWidget | None = None
    ) -> LibraryPanel:
        """The panel on the models folder, catalog and Hugging Face cache that `models` name."""
        catalog = Path(models.catalog).expanduser() if models.catalog else None
        return cls(client, models.folder(), catalog, token, include_hf_cache=models.hf_cache, parent=parent)

    def start_scan(self) -> None:
        """Size every pair for this machine's devices (a child process) for the fit badges."""
        self.machine.setText("Checking this machine's devices and memory…")
        self.fit_scan.start(self.models_dir, self.catalog_file)

    def _fits(self, fits: dict) -> None:
        self.catalog.set_fits(fits)
        self._show_fit()

    def _show_fit(self) -> None:
        pair_id = self.selected_pair()
        found = self.catalog.fits.get(pair_id or "")
        if found is None:
            ready = bool(self.catalog.fits)
            self.machine.setText(
                "Select a pair to see how it fits each device." if ready else self.machine.text()
            )
            return
        self.machine.setText("\n".join([found["placement"]["reason"], *found["devices"]]))

    def refresh(self) -> None:
        """Read the models folder again (a scan on a worker thread)."""
        self.local.scan()

    def _scanned(self) -> None:
        self.catalog.refresh_installed()
        self._fill_choices()
        self._update_buttons()

    def _fill_choices(self) -> None:
        wanted = self._wanted or {}
        target = wanted.get("target") or self.target_choice.currentData()
        drafter = wanted.get("drafter") or self.drafter_choice.currentData() or NGRAM
        projector = wanted.get("mmproj", self.projector_choice.currentData()) if wanted else None
        models = self.local.usable()
        for combo in (self.target_choice, self.drafter_choice, self.projector_choice):
            combo.blockSignals(True)
            combo.clear()
        self.projector_choice.addItem("no vision projector (text only)", None)
        for m in self.local.projectors():
            self.projector_choice.addItem(f"{m.path.name} ({m.size / 2**20:.0f} MiB)", str(m.path))
        index = self.projector_choice.findData(projector) if projector else 0
        self.projector_choice.setCurrentIndex(max(index, 0))
        self.projector_choice.blockSignals(False)
        self.drafter_choice.addItem("n-gram lookup in the conversation (no drafter model)", NGRAM)
        self.drafter_choice.addItem("nothing (plain decoding)", NO_DRAFT)
        for m in models:
            label = f"{m.path.name} ({m.architecture}, {m.size / 2**30:.2f} GiB)"
            self.target_choice.addItem(label, str(m.path))
            self.drafter_choice.addItem(label, str(m.path))
        for combo, value in ((self.target_choice, target), (self.drafter_choice, drafter)):
            index = combo.findData(value) if value else -1
            combo.setCurrentIndex(index if index >= 0 else 0)
            combo.blockSignals(False)
        if self.target_choice.currentData() == wanted.get("target"):
            self._wanted = None  # else kept until a scan shows the file (a download just finished)
        self._pair_changed()

    def choose(
        self, target: str | Path, drafter: str | Path | None = None, mmproj: str | Path | None = None
    ) -> None:
        """Pick the target, the drafter (a path, "ngram", or "none") and a vision projector to load."""
        self._wanted = {
            "target": str(target),
            "drafter": str(drafter) if drafter else NGRAM,
            "mmproj": str(mmproj) if mmproj else None,
        }
        self._fill_choices()

    # --- import ---------------------------------------------------------------------------------

    def _import_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a GGUF model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.import_file(Path(path))

    def import_file(self, path: Path, copy: bool = False) -> Background:
        """Register a GGUF file in the library (checked first; a bad file changes nothing)."""
        self.message.setText(f"Importing {path.name}…")
        self.message.setStyleSheet("")
        job = self._background(lambda: self.library.import_file(path, copy=copy))
        job.done.connect(lambda model: self._imported(model.path))
        job.failed.connect(lambda message: self._error(f"Could not import {path.name}: {message}"))
        return job.start()

    def _imported(self, path: Path) -> None:
        self._info(f"Imported {path.name}.")
        self._wanted = {"target": str(path)}
        self.local.scan()

    # --- downloads ------------------------------------------------------------------------------

    def selected_pair(self) -> str | None:
        rows = self.catalog_view.selectionModel().selectedRows()
        return self.catalog.data(rows[0], PAIR_ROLE) if rows else None

    def select_pair(self, pair_id: str) -> None:
        index = self.catalog.index(self.catalog.row_of(pair_id), 0)
        self.catalog_view.selectionModel().select(
            index,
            QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows,
        )

    def _act(self, action: Any) -> None:
        pair_id = self.selected_pair()
        if pair_id is not None:
            action(pair_id)
        self._update_buttons()

    def _download_clicked(self) -> None:
        self.message.setText("")
        self._act(self.catalog.download)

    def _catalog_chosen(self) -> None:
        pair_id = self.selected_pair()
        if pair_id is not None and (paths := self.catalog.installed(pair_id)):
            self.choose(paths["target"], paths["drafter"], paths.get("mmproj"))
        self._show_fit()
        self._download_changed(pair_id or "")

    def _download_changed(self, pair_id: str) -> None:
        if pair_id != self.selected_pair():
            return
        self._update_buttons()
        progress = self.catalog.progress.get(pair_id)
        if progress is not None and progress.total:
            self.download_bar.setValue(int(1000 * progress.done / progress.total))
        else:
            self.download_bar.setValue(0)
        state = self.catalog.states.get(pair_id)
        self.download_bar.setVisible(state in ("downloading", "paused"))
        text = self.catalog.state_text(pair_id)  # a failure is said here, once
        self.download_state.setText(f"Download {text}" if state == "failed" else text)
        self.download_state.setStyleSheet(theme.error_text(self) if state == "failed" else "")

    def _downloaded(self, pair_id: str, _paths: list) -> None:
        self._info(f"{self.catalog.pair(pair_id).name} is downloaded and verified.")
        paths = self.catalog.installed(pair_id)
        if paths:
            self._wanted = {
                "target": str(paths["target"]),
                "drafter": str(paths["drafter"]),
                "mmproj": str(paths["mmproj"]) if "mmproj" in paths else None,
            }
        self.local.scan()

    # --- pairing and loading --------------------------------------------------------------------

    def _pair_changed(self) -> None:
        target, drafter = self.target_choice.currentData(), self.drafter_choice.currentData()
        self.verdict = None
        if not target:
            self.verdict_label.setText("Import or download a model to load it.")
        elif drafter == NGRAM:
            self.verdict_label.setText(
                "N-gram drafting needs no drafter model: it looks up the conversation."
            )
        elif drafter == NO_DRAFT:
            self.verdict_label.setText("Plain decoding: no speculation.")
        elif drafter == target:
            self.verdict_label.setText("The drafter is the target itself: pick a smaller model.")
        else:
            self.verdict_label.setText("Reading both headers…")
            job = self._background(lambda: read_verdict(Path(target), Path(drafter)))
            job.done.connect(lambda verdict, t=target, d=drafter: self._verdict(t, d, verdict))
            job.failed.connect(lambda message: self.verdict_label.setText(f"No verdict: {message}"))
            job.start()
        self._update_buttons()

    def _verdict(self, target: str, drafter: str, verdict: Verdict) -> None:
        if (target, drafter) != (self.target_choice.currentData(), self.drafter_choice.currentData()):
            return  # the choice changed while the headers were read
        self.verdict = verdict
        self.verdict_label.setText(verdict.summary())
        self.verdict_label.setToolTip(
            "\n".join(f"{'pass' if r.passed else 'FAIL'}  {r.name}: {r.detail}" for r in verdict.rules)
        )
        self._update_buttons()

    def use_pair(self) -> None:
        """Load the chosen target and drafter into the running engine (no restart)."""
        target, drafter = self.target_choice.currentData(), self.drafter_choice.currentData()
        if not target or not self._engine_up or self.load_stream is not None:
            return
        draft = drafter if drafter not in (NGRAM, NO_DRAFT) else None
        mmproj = self.projector_choice.currentData()
        stream = load_pair(self.client, target, draft, ngram=drafter == NGRAM, parent=self, mmproj=mmproj)
        self._loading = (str(target), draft, drafter == NGRAM, mmproj)
        stream.stage.connect(lambda name: self.load_state.setText(f"Loading {Path(target).name}: {name}…"))
        stream.done.connect(self._loaded)
        stream.failed.connect(self._load_failed)
        self.load_stream = stream
        self.load_state.setText(f"Loading {Path(target).name}…")
        self.loadStarted.emit(stream)
        self.load_bar.show()
        self._update_buttons()

    def _loaded(self, ready: dict) -> None:
        self._end_load()
        self.loaded = self._loading
        draft = {"ngram": "n-gram lookup", "model": "a drafter model"}.get(str(ready.get("draft")), "none")
        self.load_state.setText(
            f"Loaded {ready.get('model', '?')} (context {ready.get('context_length', '?')}, drafts: {draft})."
        )
        self.pairLoaded.emit(ready)

    def _load_failed(self, message: str) -> None:
        self._end_load()
        self.load_state.setText("")
        self._error(f"The engine could not load the pair: {message}")
        self.loadFailed.emit(message)

    def _end_load(self) -> None:
        if self.load_stream is not None:
            self.load_stream.deleteLater()
        self.load_stream = None
        self.load_bar.hide()
        self._update_buttons()

    # --- engine ---------------------------------------------------------------------------------

    def engine_ready(self) -> None:
        self._engine_up = True
        self._update_buttons()

    def engine_stopped(self) -> None:
        self._engine_up = False
        self._update_buttons()

    # --- view -----------------------------------------------------------------------------------

    def _background(self, work: Any) -> Background:
        job = Background(work, self)
        self._jobs.add(job)
        job.done.connect(lambda _: self._jobs.discard(job))
        job.failed.connect(lambda _: self._jobs.discard(job))
        return job

    def wait(self, timeout: float = 30.0) -> None:
        """Join the worker threads (scans, imports, verdicts, downloads): for tests and shutdown."""
        for job in list(self._jobs):
            job.wait(timeout)
        self.local.wait(timeout)
        self.catalog.wait(timeout)

    def _update_buttons(self) -> None:
        pair_id = self.selected_pair()
        running = pair_id is not None and self.catalog.running(pair_id)
        paused = pair_id is not None and self.catalog.states.get(pair_id) == "paused"
        installed = pair_id is not None and self.catalog.installed(pair_id) is not None
        self.download_button.setText("Resume" if paused else "Download")
        self.download_button.setEnabled(pair_id is not None and not running and not installed)
        self.pause_button.setEnabled(running)
        self.cancel_button.setEnabled(running or paused)
        loading = self.load_stream is not None
        self.use_button.setEnabled(self._engine_up and not loading and bool(self.target_choice.currentData()))
        if not self._engine_up and not loading:
            self.use_button.setToolTip("The engine is not running.")
        else:
            self.use_button.setToolTip("")

    def show_images_section(self) -> None:
        """Open on the pair to load with its "Images" choice (a vision projector) in view and focus."""
        self.show()
        self.raise_()
        area = self.widget()
        if isinstance(area, QScrollArea):
            area.ensureWidgetVisible(self.use_box)
        self.projector_choice.setFocus()

    def _error(self, text: str) -> None:
        self.message.setStyleSheet(theme.error_text(self))
        self.message.setText(text)

    def _info(self, text: str) -> None:
        self.message.setStyleSheet("")
        self.message.setText(text)
