"""What the side panels share: their contents scroll rather than widen the window."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget

PANEL_MIN_WIDTH = 300  # a panel beside the chat at 1024 px: sidebar + chat + this fit


def scrolled(body: QWidget, min_width: int = PANEL_MIN_WIDTH) -> QScrollArea:
    """`body` in a scroll area that asks for little room: the dock never makes the window grow."""
    area = QScrollArea()
    area.setWidget(body)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
    area.setMinimumWidth(min_width)
    return area
