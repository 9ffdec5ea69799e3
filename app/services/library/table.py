"""What the library's table models share: a flat table of rows under named columns, the role that
carries a row's key, and sizes in words."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

ModelIndex = QModelIndex | QPersistentModelIndex
PAIR_ROLE = Qt.ItemDataRole.UserRole  # a row's key: a pair's id, a local file's path


def size_text(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class TableModel(QAbstractTableModel):
    """A flat table of `rows()`, headed by COLUMNS."""

    COLUMNS: tuple[str, ...] = ()

    def rows(self) -> list[Any]:
        raise NotImplementedError

    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows())

    def columnCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        return None
