"""View > Engine log: the engine process's own output as it comes, as many lines as its wrapper keeps."""

from __future__ import annotations

from PySide6.QtWidgets import QDockWidget, QPlainTextEdit, QWidget

from app.services.engine import LOG_LINES, EngineProcess


class EngineLog(QDockWidget):
    def __init__(self, engine: EngineProcess, parent: QWidget | None = None) -> None:
        super().__init__("Engine log", parent)
        self.setObjectName("engine-log")
        self.view = QPlainTextEdit(readOnly=True)
        self.view.setMaximumBlockCount(engine.log.maxlen or LOG_LINES)
        self.setWidget(self.view)
        engine.logLine.connect(self.view.appendPlainText)
