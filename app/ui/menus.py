"""The window's menu bar: File (the chat data, settings, the tray option, quit) and View (draft
highlighting, the panels)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow

from app.ui.data_menu import DataActions

HIGHLIGHT_TIP = "Mark the text the target accepted from drafts (checked in one pass, not written one by one)"


def add_file_menu(
    window: QMainWindow,
    data_actions: DataActions,
    tray_action: QAction,
    edit_settings: Callable[[], object],
    quit_app: Callable[[], None],
) -> None:
    menu = window.menuBar().addMenu("&File")
    data_actions.add_to_menu(menu)
    menu.addSeparator()
    menu.addAction("&Settings…", edit_settings)
    menu.addAction(tray_action)
    menu.addAction("&Quit", quit_app, QKeySequence.StandardKey.Quit)


def add_view_menu(window: QMainWindow, docks: Iterable[tuple[QDockWidget, str]]) -> QAction:
    """The View menu: "Highlight accepted drafts" (returned, checkable), then a switch for each dock named
    by its text."""
    menu = window.menuBar().addMenu("&View")
    menu.setToolTipsVisible(True)
    highlight = QAction("&Highlight accepted drafts", window, checkable=True)
    highlight.setToolTip(HIGHLIGHT_TIP)
    highlight.setStatusTip(HIGHLIGHT_TIP)
    menu.addAction(highlight)
    menu.addSeparator()
    for dock, text in docks:
        action = dock.toggleViewAction()
        action.setText(text)
        menu.addAction(action)
    return highlight
