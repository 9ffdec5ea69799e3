"""A one-line label that shortens its text with "…" to the width it is given (the whole text in its tool
tip), so long names never widen the window."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_CHARS = 6  # the narrowest it asks for: a few letters and the ellipsis


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._full = ""
        self.setText(text)

    def setText(self, text: str) -> None:
        self._full = text
        super().setText(text)
        self.setToolTip(text if text else "")

    def text(self) -> str:
        return self._full

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        return QSize(self.fontMetrics().averageCharWidth() * MIN_CHARS, hint.height())

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + 4, super().sizeHint().height())

    def elided(self) -> str:
        """The text as it fits now."""
        return self.fontMetrics().elidedText(
            self._full, Qt.TextElideMode.ElideRight, self.contentsRect().width()
        )

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(
            self.contentsRect(), int(self.alignment()) | Qt.TextFlag.TextSingleLine, self.elided()
        )
