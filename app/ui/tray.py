"""File > Keep the API serving when the window closes: the window goes to the system tray, the engine and
its API listener keep running, and the tray brings the window back or quits."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import QMenu, QSystemTrayIcon, QWidget


class ServingTray(QObject):
    """The option (`action`, checkable) and the tray icon it puts up, which shows the window again;
    `refused` says why a desktop without a tray cannot have it."""

    quitRequested = Signal()
    refused = Signal(str)

    def __init__(self, window: QWidget, icon: QIcon) -> None:
        super().__init__(window)
        self.window = window
        self.icon = icon
        self.action = QAction("&Keep the API serving when the window closes", window, checkable=True)
        self.action.setToolTip("Closing the window leaves Foresight in the system tray; quit from there")
        self.action.toggled.connect(self._toggled)
        self.tray: QSystemTrayIcon | None = None

    @property
    def keeps_serving(self) -> bool:
        """Whether closing the window only hides it."""
        return self.action.isChecked()

    @property
    def shown(self) -> bool:
        return self.tray is not None and self.tray.isVisible()

    def notify(self, text: str) -> None:
        if self.tray is not None:
            self.tray.showMessage("Foresight", text)

    def hide(self) -> None:
        if self.tray is not None:
            self.tray.hide()

    def show_window(self) -> None:
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()

    def _toggled(self, on: bool) -> None:
        if on and self.tray is None:
            if not QSystemTrayIcon.isSystemTrayAvailable():
                self.action.setChecked(False)
                self.refused.emit("This desktop has no system tray: closing the window quits.")
                return
            self.tray = QSystemTrayIcon(self.icon, self)
            self.tray.setToolTip("Foresight")
            menu = QMenu(self.window)
            menu.addAction("Show Foresight", self.show_window)
            menu.addAction("Quit", lambda: self.quitRequested.emit())
            self.tray.setContextMenu(menu)
            self.tray.activated.connect(self._clicked)
        if self.tray is not None:
            self.tray.setVisible(on)

    def _clicked(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.show_window()
