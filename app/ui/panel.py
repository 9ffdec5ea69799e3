"""What the side panels share: their contents scroll rather than widen the window, and they stack as tabs
on one side."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QFrame, QMainWindow, QScrollArea, QWidget

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


def stack_side_panels(window: QMainWindow, panels: tuple[QDockWidget, ...]) -> None:
    """`panels` as one stack of tabs on the window's right, hidden until asked for: a panel takes the
    chat's room, not more."""
    for panel in panels:
        window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, panel)
        panel.hide()
    for panel in panels[1:]:
        window.tabifyDockWidget(panels[0], panel)
