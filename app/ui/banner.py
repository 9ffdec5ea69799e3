"""The banner above the transcript: what went wrong or what is missing, why, and the way out it offers.

A banner may belong to one conversation (`scope`): it shows while that conversation is shown and hides
for the others. Its colours come from the palette in use (app.ui.theme), and the user can close it.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from app.ui import theme


class Banner(QFrame):
    """One message at a time, with the buttons that help: Restart (the engine), Download (the first
    model), Continue and Regenerate (an answer cut short); hidden until there is something to say."""

    closed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.kind = "error"
        self.scope: int | None = None  # the conversation it belongs to (None: every one)
        self._shown_for: int | None = None
        self._active = False  # something to say (it may be hidden for another conversation)
        self.label = QLabel(wordWrap=True, textInteractionFlags=Qt.TextInteractionFlag.TextBrowserInteraction)
        self.label.setOpenExternalLinks(False)
        self.download_button = QPushButton("Download")
        self.restart_button = QPushButton("Restart the engine")
        self.continue_button = QPushButton("Continue")
        self.continue_button.setToolTip("Carry on from where the answer stopped")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Write the answer again from the start")
        self.close_button = QToolButton(text="✕", autoRaise=True)
        self.close_button.setToolTip("Close this message")
        self.close_button.setAccessibleName("Close this message")
        self.close_button.clicked.connect(self.dismiss)
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 6, 4, 6)
        row.addWidget(self.label, 1)
        for button in (
            self.download_button,
            self.continue_button,
            self.regenerate_button,
            self.restart_button,
        ):
            button.hide()
            row.addWidget(button)
        row.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self._restyle()
        theme.notifier().changed.connect(self._restyle)
        self.hide()

    def say(
        self,
        text: str,
        restart: bool = False,
        scope: int | None = None,
        kind: str = "error",
        answer_actions: bool = False,
    ) -> None:
        """Show `text` (of kind error, warning or info); Restart where restarting the engine is the way
        out, Continue and Regenerate for an answer cut short; `scope` ties it to one conversation."""
        self.label.setText(text)
        self.kind = kind
        self.scope = scope
        self.restart_button.setVisible(restart)
        self.continue_button.setVisible(answer_actions)
        self.regenerate_button.setVisible(answer_actions)
        self.download_button.hide()
        self._active = True
        self._restyle()
        self.setVisible(scope is None or scope == self._shown_for)

    def show_for(self, conversation_id: int | None) -> None:
        """The window shows this conversation now: a banner of another one hides (and comes back later)."""
        self._shown_for = conversation_id
        if self._active:
            self.setVisible(self.scope is None or self.scope == conversation_id)

    def dismiss(self) -> None:
        """Hide the message for good (until the next one)."""
        self._active = False
        self.scope = None
        self.hide()
        self.closed.emit()

    def dismiss_scope(self, conversation_id: int | None) -> None:
        """Forget a message of this conversation (it was deleted, or its answer was carried on)."""
        if self._active and self.scope is not None and self.scope == conversation_id:
            self.dismiss()

    def text(self) -> str:
        return self.label.text()

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._restyle()
        super().changeEvent(event)

    def _restyle(self) -> None:
        tone = theme.tone(self.kind)  # the application's palette: this frame's own follows its style sheet
        sheet = f"QFrame#banner {{ {tone.style()} }} QFrame#banner QLabel {{ color: {tone.text}; }}"
        if sheet != self.styleSheet():
            self.setStyleSheet(sheet)
