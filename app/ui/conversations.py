"""The conversation list: the store's conversations as a list model with roles, and its view (New chat,
search, and a menu to rename, set up or delete one)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    Signal,
)
from PySide6.QtWidgets import (
    QInputDialog,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chats.store import ChatStore, Conversation

ModelIndex = QModelIndex | QPersistentModelIndex
ID_ROLE = Qt.ItemDataRole.UserRole
UPDATED_ROLE = Qt.ItemDataRole.UserRole + 1
MIN_WIDTH = 170  # the sidebar keeps room for a readable title whatever panels are open


class ConversationList(QAbstractListModel):
    """The store's conversations matching `search`, newest activity first: the title (display and tool
    tip), the id (ID_ROLE) and the time of the last activity (UPDATED_ROLE). `refresh` reads them again."""

    def __init__(self, store: ChatStore, parent: Any = None) -> None:
        super().__init__(parent)
        self.store = store
        self.search = ""
        self._rows: list[Conversation] = []
        self.refresh()

    def refresh(self, search: str | None = None) -> None:
        if search is not None:
            self.search = search
        self.beginResetModel()
        self._rows = self.store.conversations(self.search)
        self.endResetModel()

    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        c = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return c.title
        if role == ID_ROLE:
            return c.id
        if role == UPDATED_ROLE:
            return c.updated
        return None

    def row_of(self, conversation_id: int | None) -> int:
        """The row of a conversation, or -1 where it is not listed (filtered out, or None)."""
        return next((i for i, c in enumerate(self._rows) if c.id == conversation_id), -1)

    def titles(self) -> list[str]:
        return [c.title for c in self._rows]


class ConversationsView(QWidget):
    """New chat, the search box and the list. Choosing a row emits `chosen`; the window says which
    conversation is shown with `show_current` (which emits nothing)."""

    chosen = Signal(int)
    newRequested = Signal()
    renamed = Signal(int, str)  # conversation id, the new title
    deleted = Signal(int)  # after the user confirmed it
    settingsRequested = Signal(int)

    def __init__(self, model: ConversationList, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self._current: int | None = None
        self.new_button = QPushButton("New chat")
        self.new_button.clicked.connect(self.newRequested)
        self.search = QLineEdit(placeholderText="Search conversations")
        self.search.textChanged.connect(self.model.refresh)
        self.list = QListView()
        self.list.setModel(model)
        self.list.setEditTriggers(QListView.EditTrigger.NoEditTriggers)
        # a long title is shortened with "…" (its whole text in the tool tip), never scrolled sideways
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setWordWrap(False)
        self.list.setUniformItemSizes(True)
        self.list.selectionModel().currentChanged.connect(self._current_changed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        model.modelReset.connect(lambda: self.show_current(self._current))
        self.setMinimumWidth(MIN_WIDTH)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 0, 4)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list)

    def show_current(self, conversation_id: int | None) -> None:
        """Mark the conversation shown (if it is listed) without emitting `chosen`."""
        self._current = conversation_id
        selection = self.list.selectionModel()
        selection.blockSignals(True)
        try:
            row = self.model.row_of(conversation_id)
            if row < 0:
                selection.clear()
            else:
                flag = QItemSelectionModel.SelectionFlag.ClearAndSelect
                selection.setCurrentIndex(self.model.index(row), flag)
        finally:
            selection.blockSignals(False)
        self.list.viewport().update()

    def choose_row(self, row: int) -> None:
        """Choose the conversation in `row`, as a click on it does."""
        self.list.setCurrentIndex(self.model.index(row))

    def set_busy(self, busy: bool) -> None:
        """While an answer streams, the conversation shown stays: no switching, no new chat."""
        self.new_button.setEnabled(not busy)
        self.list.setEnabled(not busy)

    def _current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid():
            self.chosen.emit(int(current.data(ID_ROLE)))

    def _menu(self, pos: Any) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid() or not self.list.isEnabled():
            return
        conversation_id = int(index.data(ID_ROLE))
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._ask_rename(conversation_id, str(index.data())))
        menu.addAction("Settings…", lambda: self.settingsRequested.emit(conversation_id))
        menu.addAction("Delete…", lambda: self._ask_delete(conversation_id, str(index.data())))
        menu.popup(self.list.viewport().mapToGlobal(pos))

    def _ask_rename(self, conversation_id: int, old: str) -> None:
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title", text=old)
        if ok and title.strip():
            self.renamed.emit(conversation_id, title)

    def _ask_delete(self, conversation_id: int, title: str) -> None:
        answer = QMessageBox.question(self, "Delete conversation", f"Delete “{title}” and all its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.deleted.emit(conversation_id)
