"""What the window was like when it closed, to come back to on the next start: its size and place, the
panels open, the splitter, the last conversation shown, and the local API server's switch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow, QSplitter

from app import paths

FILE = "window.ini"
VERSION = 1  # QMainWindow.saveState's: a layout saved by another version of the panels is not restored


@dataclass(frozen=True)
class ApiSwitch:
    """The local API server as it was left: on or off, its port, and whether the network may reach it."""

    on: bool = False
    port: int = 8080
    lan: bool = False


class WindowSession:
    """The window's session file (an INI file in the data dir, or `path`)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else paths.data_dir() / FILE
        self._settings = QSettings(str(self.path), QSettings.Format.IniFormat)

    # --- layout ------------------------------------------------------------------------------------

    def restore_layout(self, window: QMainWindow, split: QSplitter) -> bool:
        """Put the window back as it was (size, place, panels, splitter); False where nothing was saved."""
        geometry = self._settings.value("window/geometry")
        if not isinstance(geometry, QByteArray):
            return False
        window.restoreGeometry(geometry)
        state = self._settings.value("window/state")
        if isinstance(state, QByteArray):
            window.restoreState(state, VERSION)
        sizes = self._settings.value("window/split")
        if isinstance(sizes, QByteArray):
            split.restoreState(sizes)
        return True

    def save_layout(self, window: QMainWindow, split: QSplitter) -> None:
        self._settings.setValue("window/geometry", window.saveGeometry())
        self._settings.setValue("window/state", window.saveState(VERSION))
        self._settings.setValue("window/split", split.saveState())

    # --- the conversation and the API switch --------------------------------------------------------

    @property
    def conversation(self) -> int | None:
        value = self._settings.value("chat/conversation")
        try:
            return int(value) if value not in (None, "") else None  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    @conversation.setter
    def conversation(self, conversation_id: int | None) -> None:
        self._settings.setValue("chat/conversation", "" if conversation_id is None else conversation_id)

    @property
    def api(self) -> ApiSwitch | None:
        """The switch as it was left, or None where it was never saved (the window's own default holds)."""
        s = self._settings
        if not s.contains("api/on"):
            return None

        def flag(key: str) -> bool:
            return str(s.value(key, "false")).lower() == "true"

        try:
            port = int(s.value("api/port", ApiSwitch.port))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            port = ApiSwitch.port
        return ApiSwitch(flag("api/on"), port if 0 <= port <= 65535 else ApiSwitch.port, flag("api/lan"))

    @api.setter
    def api(self, switch: ApiSwitch) -> None:
        self._settings.setValue("api/on", switch.on)
        self._settings.setValue("api/port", switch.port)
        self._settings.setValue("api/lan", switch.lan)

    def sync(self) -> None:
        self._settings.sync()
