"""The real window in a process of its own (offscreen), for tests that kill it: it starts its engine,
switches the local API server on, asks a long question, and once the answer streams prints one JSON line
(its engine's pid, private port and public port), then runs until it is killed.

  python tests/ui/window_process.py TARGET.gguf FOLDER
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QApplication

from app.chats.store import ChatStore
from app.config import SamplingSettings
from app.services.engine import EngineLaunch
from app.ui.main_window import MainWindow
from app.ui.session import ApiSwitch, WindowSession

QUESTION = "Write a long story about a lighthouse keeper and a storm."


def main() -> int:
    target, folder = sys.argv[1], Path(sys.argv[2])
    app = QApplication(sys.argv[:1])
    store = ChatStore(folder / "chats.sqlite3")
    session = WindowSession(folder / "window.ini")
    session.api = ApiSwitch(on=True, port=0)
    launch = EngineLaunch(target, draft={"mode": "ngram"}, engine={"n_ctx": 1024, "n_threads": 1})
    window = MainWindow(
        store, launch, sampling=SamplingSettings(temperature=0.0, max_tokens=2000), session=session
    )
    window.show()
    told = {"done": False}

    def opened(info: dict) -> None:
        if info.get("open"):
            window.send(QUESTION)

    def streaming() -> None:
        if not told["done"] and len(window.conversation.answer_text) > 20:
            told["done"] = True
            ports = {
                "engine": window.engine.pid,
                "port": window.engine.port,
                "public": window.api_panel.info["port"],
            }
            print(json.dumps(ports), flush=True)

    window.api_panel.changed.connect(opened)
    window.conversation.answerGrew.connect(streaming)
    window.start_engine()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
