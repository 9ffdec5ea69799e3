"""The banner above the transcript: what went wrong or what is missing, and the action it offers."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

BANNER_STYLE = "background: #fde8e8; color: #7a1010; padding: 8px; border-radius: 4px;"


class Banner(QWidget):
    """One message at a time, with a Restart button (the engine) and a Download button (the first model)
    shown where they help; hidden until there is something to say."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel(wordWrap=True)
        self.label.setStyleSheet(BANNER_STYLE)
        self.download_button = QPushButton("Download")
        self.download_button.hide()
        self.restart_button = QPushButton("Restart the engine")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.download_button)
        row.addWidget(self.restart_button)
        self.hide()

    def say(self, text: str, restart: bool) -> None:
        """Show `text`, with the Restart button when restarting the engine is the way out."""
        self.label.setText(text)
        self.restart_button.setVisible(restart)
        self.show()

    def text(self) -> str:
        return self.label.text()
