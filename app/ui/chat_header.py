"""The header of the chat: the loaded model and how it runs (drafter, device, context), a button to pick
another in the library, and what the engine is doing now (its start stages with progress, an answer
being written)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QGridLayout, QProgressBar, QPushButton, QSizePolicy, QWidget

from app.services.engine_status import EngineStatus
from app.ui.elided import ElidedLabel

PROGRESS_HEIGHT = 6
PROGRESS_WIDTH = 120
DRAFT_LEGEND = (
    "Highlighted: text the target accepted from drafts (checked in one pass instead of written token "
    "by token)"
)


class ChatHeader(QWidget):
    """Shows `status` (app.services.engine_status) as it changes; `pickModel` asks for the library."""

    pickModel = Signal()

    def __init__(self, status: EngineStatus, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chat-header")
        self.status = status
        self.writing = False
        self.model = ElidedLabel()
        font = self.model.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.1)
        self.model.setFont(font)
        self.details = ElidedLabel()
        self.details.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.state = ElidedLabel()
        self.state.setObjectName("engine-state")
        self.legend = ElidedLabel(DRAFT_LEGEND)
        self.legend.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.legend.hide()
        self.progress = QProgressBar(textVisible=False, minimum=0, maximum=100)
        self.progress.setFixedSize(PROGRESS_WIDTH, PROGRESS_HEIGHT)
        self.progress.hide()
        self.pick = QPushButton("Models…")
        self.pick.setToolTip("Choose another model, or download one (View > Model library)")
        self.pick.clicked.connect(self.pickModel)
        self.pick.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        grid = QGridLayout(self)
        grid.setContentsMargins(2, 0, 2, 4)
        grid.setVerticalSpacing(2)
        grid.addWidget(self.model, 0, 0)
        grid.addWidget(self.pick, 0, 1, 2, 1, Qt.AlignmentFlag.AlignVCenter)
        grid.addWidget(self.details, 1, 0)
        grid.addWidget(self.state, 2, 0)
        grid.addWidget(self.progress, 2, 1)
        grid.addWidget(self.legend, 3, 0, 1, 2)
        grid.setColumnStretch(0, 1)
        status.changed.connect(self.refresh)
        self.refresh()

    def set_writing(self, writing: bool) -> None:
        """An answer is being written (the streaming indicator)."""
        self.writing = writing
        self.refresh()

    def show_legend(self, on: bool) -> None:
        self.legend.setVisible(on)

    def refresh(self) -> None:
        status = self.status
        self.model.setText(status.target_text())
        self.details.setText(status.details_text())
        self.details.setVisible(bool(status.details_text()))
        if self.writing and status.state == "ready":
            self.state.setText("Writing the answer…")
            self._bar(busy=True)
        else:
            self.state.setText(status.state_text())
            if status.busy:
                self._bar(busy=status.share is None, share=status.share or 0)
            else:
                self.progress.hide()
        self.state.setToolTip(status.state_text())

    def _bar(self, busy: bool, share: int = 0) -> None:
        self.progress.setMaximum(0 if busy else 100)  # 0: Qt's busy indicator
        self.progress.setValue(share)
        self.progress.show()
