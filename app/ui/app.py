"""`python -m app` (and the frozen executable without arguments): the desktop window."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication

from app import paths
from app.chats import ChatStore
from app.ui.main_window import MainWindow


def run(engine_args: list[str], n_ctx: int, sampling: dict) -> int:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Foresight")
    store = ChatStore(paths.data_dir() / "chats.sqlite3")
    window = MainWindow(store, engine_args, n_ctx=n_ctx, sampling=sampling)
    window.show()
    window.start_engine()
    try:
        return app.exec()
    finally:
        store.close()
