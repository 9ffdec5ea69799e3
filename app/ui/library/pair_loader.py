"""Use this pair: loading the picked pair into the running engine, stage by stage."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.services.client import EngineClient
from app.services.library.loading import LoadStream, load_pair
from app.ui.library.pair_picker import PickedPair


class PairLoader(QWidget):
    """Loads the pair given with `set_pair` into the running engine (no restart) while the engine is up;
    `loaded` is the last pair it loaded."""

    loadStarted = Signal(object)  # the LoadStream of a pair being loaded (its stages, for the header)
    pairLoaded = Signal(dict)  # the engine's "ready" event: {"model", "draft", "context_length", ...}
    loadFailed = Signal(str)

    def __init__(self, client: EngineClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.pair: PickedPair | None = None
        self.load_stream: LoadStream | None = None
        self._loading: PickedPair | None = None
        self.loaded: PickedPair | None = None
        self._engine_up = False
        self.use_button = QPushButton("Use this pair")
        self.use_button.clicked.connect(self.use_pair)
        self.load_bar = QProgressBar(minimum=0, maximum=0)  # busy: the engine reports stages, not shares
        self.load_bar.hide()
        self.load_state = QLabel("", wordWrap=True)
        row = QHBoxLayout()
        row.addWidget(self.use_button)
        row.addWidget(self.load_bar, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.load_state)
        self._update_button()

    def set_pair(self, pair: PickedPair | None) -> None:
        """The pair Use this pair loads (None: no target to load)."""
        self.pair = pair
        self._update_button()

    def use_pair(self) -> None:
        """Load the pair into the running engine (no restart)."""
        pair = self.pair
        if pair is None or not self._engine_up or self.load_stream is not None:
            return
        stream = load_pair(
            self.client, pair.target, pair.draft, ngram=pair.ngram, parent=self, mmproj=pair.mmproj
        )
        self._loading = pair
        name = Path(pair.target).name
        stream.stage.connect(lambda stage: self.load_state.setText(f"Loading {name}: {stage}…"))
        stream.done.connect(self._loaded)
        stream.failed.connect(self._load_failed)
        self.load_stream = stream
        self.load_state.setText(f"Loading {name}…")
        self.loadStarted.emit(stream)
        self.load_bar.show()
        self._update_button()

    def engine_ready(self) -> None:
        self._engine_up = True
        self._update_button()

    def engine_stopped(self) -> None:
        self._engine_up = False
        self._update_button()

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
        self.loadFailed.emit(message)

    def _end_load(self) -> None:
        if self.load_stream is not None:
            self.load_stream.deleteLater()
        self.load_stream = None
        self.load_bar.hide()
        self._update_button()

    def _update_button(self) -> None:
        loading = self.load_stream is not None
        self.use_button.setEnabled(self._engine_up and not loading and self.pair is not None)
        if not self._engine_up and not loading:
            self.use_button.setToolTip("The engine is not running.")
        else:
            self.use_button.setToolTip("")
