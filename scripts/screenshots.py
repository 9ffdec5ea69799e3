"""Screenshots of the main views with real content, for README.md (docs/screenshots/).

The real window runs with its own engine on a real model, answers a real question, switches the local
API server on, lists the devices this machine has and sizes the model catalog for it; each view is then
grabbed from the window itself (under Xvfb: `xvfb-run -a python scripts/screenshots.py`; offscreen
without a display).

  xvfb-run -a python scripts/screenshots.py [--target qwen2.5-coder-1.5b-instruct]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

if not os.environ.get("DISPLAY"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.catalog.packaged import resolve_model
from app.chats.store import ChatStore
from app.config import SamplingSettings
from app.services.engine import EngineLaunch
from app.ui.main_window import MainWindow

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Rename the variable `x` to `total` in:\n\ndef add(x, y):\n    x = x + y\n    return x"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv[:1])
    app.setApplicationName("Foresight")
    result = {"code": 1}
    with tempfile.TemporaryDirectory() as tmp, ChatStore(Path(tmp) / "chats.sqlite3") as store:
        window = MainWindow(
            store,
            EngineLaunch(str(resolve_model(a.target)), draft={"mode": "ngram"}),
            sampling=SamplingSettings(temperature=0.0, max_tokens=200),
            api_port=0,
        )
        window.resize(1280, 800)
        window.highlight_drafts.setChecked(True)  # the answer's drafted text shows on green
        window.show()

        def shoot(name: str) -> None:
            path = a.out / f"{name}.png"
            window.grab().save(str(path))
            print(f"saved {path.relative_to(ROOT)}")

        def answered(status: str, _usage: dict) -> None:
            if status != "complete":
                print(f"the answer ended {status}")
                app.quit()
                return
            QTimer.singleShot(300, serve)

        def serve() -> None:
            shoot("chat")
            window.api_panel.show()
            window.api_panel.changed.connect(served)
            window.api_panel.toggle.click()

        def served(info: dict) -> None:
            if not info.get("open"):
                print(f"the API server did not start: {window.api_panel.status.text()}")
                app.quit()
                return
            window.api_panel.client_choice.setCurrentText("Continue")
            QTimer.singleShot(200, devices)

        def devices() -> None:
            shoot("api-server")
            window.api_panel.hide()
            window.devices_panel.scanned.connect(lambda: QTimer.singleShot(200, library))
            window.devices_panel.show()

        def library() -> None:
            shoot("devices")
            window.devices_panel.hide()
            window.library_panel.fit_scan.scanned.connect(lambda *_: QTimer.singleShot(500, last))
            window.library_panel.show()  # the first showing sizes the catalog for this machine

        def last() -> None:
            shoot("library")
            result.update(code=0)
            app.quit()

        window.engine.ready.connect(lambda _port: window.send(QUESTION))
        window.conversation.answerFinished.connect(answered)
        window.start_engine()
        QTimer.singleShot(600_000, app.quit)
        app.exec()
        window.close()
    return result["code"]


if __name__ == "__main__":
    sys.exit(main())
