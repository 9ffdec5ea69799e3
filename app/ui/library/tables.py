"""How the library's tables look: one row selected at a time, columns sized to their text, long text
elided, and room for a few rows however the panel is squeezed."""

from __future__ import annotations

from PySide6.QtCore import QAbstractItemModel, Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView

NAME_WIDTH = 190
COLUMN_WIDTH = 120
MIN_COLUMN_WIDTH = 48
MIN_ROWS_SHOWN = 4  # a table keeps room for this many rows however the panel is squeezed


def library_table(model: QAbstractItemModel) -> QTableView:
    """A read-only table view of `model` whose columns follow its contents when it is reset."""
    view = QTableView()
    view.setModel(model)
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    view.verticalHeader().hide()
    view.setWordWrap(False)
    view.setTextElideMode(Qt.TextElideMode.ElideRight)  # a long name is shortened, never clipped
    header = view.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)  # the user can widen a column
    header.setStretchLastSection(True)
    header.setDefaultSectionSize(COLUMN_WIDTH)
    header.setMinimumSectionSize(MIN_COLUMN_WIDTH)
    view.setMinimumHeight(view.verticalHeader().defaultSectionSize() * MIN_ROWS_SHOWN)
    model.modelReset.connect(lambda: fit_columns(view))
    fit_columns(view)
    return view


def fit_columns(view: QTableView) -> None:
    """Columns as wide as their text, up to NAME_WIDTH for the first (the name) and COLUMN_WIDTH for the
    others: the rest elides, and the user can widen them."""
    for column in range(view.model().columnCount() - 1):
        view.resizeColumnToContents(column)
        widest = NAME_WIDTH if column == 0 else COLUMN_WIDTH
        view.setColumnWidth(column, min(view.columnWidth(column), widest))
