"""The File menu's chat data actions: export, import and delete all, with their file dialogs and questions."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QMenu, QMessageBox, QWidget

from app.chats.store import ChatStore
from app.chats.transfer import (
    ImportFailed,
    damaged_copies,
    data_summary,
    delete_all_data,
    export_all_json,
    export_file_name,
    export_markdown,
    import_json_file,
)


class Prompts:
    """The file dialogs and message boxes of DataActions (tests subclass it with scripted answers)."""

    def save_path(self, parent: QWidget | None, title: str, suggested: Path, file_filter: str) -> Path | None:
        path, _ = QFileDialog.getSaveFileName(parent, title, str(suggested), file_filter)
        return Path(path) if path else None

    def open_path(self, parent: QWidget | None, title: str, file_filter: str) -> Path | None:
        path, _ = QFileDialog.getOpenFileName(parent, title, str(Path.home()), file_filter)
        return Path(path) if path else None

    def confirm(self, parent: QWidget | None, title: str, text: str, action: str) -> bool:
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent)
        go = box.addButton(action, QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(box.addButton(QMessageBox.StandardButton.Cancel))
        box.exec()
        return box.clickedButton() is go

    def inform(self, parent: QWidget | None, title: str, text: str) -> None:
        QMessageBox.information(parent, title, text)

    def warn(self, parent: QWidget | None, title: str, text: str) -> None:
        QMessageBox.warning(parent, title, text)


class DataActions(QObject):
    """The File menu's export, import and delete-all, with their dialogs.

    `current` gives the conversation shown (for the Markdown export). `storeChanged` fires after an
    import or a delete-all: the window refreshes its list (and forgets its current conversation after
    a delete-all, which `deletedAll` signals).
    """

    storeChanged = Signal()
    deletedAll = Signal()

    def __init__(
        self,
        store: ChatStore,
        parent: QWidget,
        current: Callable[[], int | None] = lambda: None,
        prompts: Prompts | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.window = parent
        self.current = current
        self.prompts = prompts or Prompts()
        self.export_all_action = QAction("&Export all conversations (JSON)…", parent)
        self.export_all_action.triggered.connect(self.export_all)
        self.export_markdown_action = QAction("Export this conversation (&Markdown)…", parent)
        self.export_markdown_action.triggered.connect(self.export_current)
        self.import_action = QAction("&Import conversations (JSON)…", parent)
        self.import_action.triggered.connect(self.import_file)
        self.delete_all_action = QAction("&Delete all my data…", parent)
        self.delete_all_action.triggered.connect(self.delete_all)

    def add_to_menu(self, menu: QMenu) -> None:
        menu.addAction(self.export_all_action)
        menu.addAction(self.export_markdown_action)
        menu.addAction(self.import_action)
        menu.addSeparator()
        menu.addAction(self.delete_all_action)
        menu.aboutToShow.connect(lambda: self.export_markdown_action.setEnabled(self.current() is not None))

    def export_all(self) -> Path | None:
        if not self.store.conversations():
            self.prompts.inform(self.window, "Export", "There are no conversations to export.")
            return None
        suggested = Path.home() / time.strftime("foresight-chats-%Y-%m-%d.json")
        path = self.prompts.save_path(self.window, "Export all conversations", suggested, "JSON (*.json)")
        if path is None:
            return None
        try:
            count = export_all_json(self.store, path)
        except OSError as exc:
            self.prompts.warn(self.window, "Export", f"{path} could not be written: {exc.strerror or exc}")
            return None
        self.prompts.inform(self.window, "Export", f"{count} conversation(s) exported to {path}.")
        return path

    def export_current(self) -> Path | None:
        conversation_id = self.current()
        if conversation_id is None:
            self.prompts.inform(self.window, "Export", "Choose a conversation to export first.")
            return None
        title = self.store.conversation(conversation_id).title
        suggested = Path.home() / export_file_name(title, ".md")
        path = self.prompts.save_path(self.window, "Export this conversation", suggested, "Markdown (*.md)")
        if path is None:
            return None
        try:
            export_markdown(self.store, conversation_id, path)
        except OSError as exc:
            self.prompts.warn(self.window, "Export", f"{path} could not be written: {exc.strerror or exc}")
            return None
        return path

    def import_file(self) -> int:
        """Returns how many conversations were added (0: cancelled or refused)."""
        path = self.prompts.open_path(self.window, "Import conversations", "JSON (*.json);;All files (*)")
        if path is None:
            return 0
        try:
            count = import_json_file(self.store, path)
        except ImportFailed as exc:
            self.prompts.warn(self.window, "Import", f"{exc}\n\nNothing was imported.")
            return 0
        self.storeChanged.emit()
        self.prompts.inform(self.window, "Import", f"{count} conversation(s) imported from {path.name}.")
        return count

    def delete_all(self) -> bool:
        conversations, messages = data_summary(self.store)
        copies = damaged_copies(self.store)
        text = (
            f"Delete all {conversations} conversation(s) and their {messages} message(s), "
            f"system prompts and settings from {self.store.path}?"
        )
        if copies:
            text += f"\n\nAlso deleted: {len(copies)} damaged chat file(s) set aside earlier: " + ", ".join(
                p.name for p in copies
            )
        text += (
            "\n\nThis cannot be undone; export first to keep a copy. Your app settings, models and "
            "Hugging Face token are not touched."
        )
        if not self.prompts.confirm(self.window, "Delete all my data", text, "Delete everything"):
            return False
        delete_all_data(self.store)
        self.deletedAll.emit()
        self.storeChanged.emit()
        return True
