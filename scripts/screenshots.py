"""Screenshots of the main views with real content, for README.md (docs/screenshots/).

The real window runs with its own engine on a real model in a fresh data folder, so the first start is
real too: the engine assembles the packaged model (the header shows its progress), loads it, answers a
real question, switches the local API server on, lists the devices this machine has and sizes the model
catalog for it; each view is then grabbed from the window itself (under Xvfb: `xvfb-run -a python
scripts/screenshots.py`; offscreen without a display).

  xvfb-run -a python scripts/screenshots.py [--target qwen2.5-coder-1.5b-instruct]

Shots: first-start (assembling, with progress), chat (header, answer, drafted text highlighted),
api-server, devices, library (the window at 1024x700), settings, dark (the dark theme).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

if not os.environ.get("DISPLAY"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
HOME = tempfile.TemporaryDirectory(prefix="foresight-shots-")
os.environ["FORESIGHT_HOME"] = HOME.name  # a first start: nothing assembled, no settings, no session

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402

from app.chats.store import ChatStore  # noqa: E402
from app.config import SamplingSettings  # noqa: E402
from app.services.engine import EngineLaunch  # noqa: E402
from app.ui import theme  # noqa: E402
from app.ui.main_window import MainWindow  # noqa: E402
from app.ui.session import WindowSession  # noqa: E402
from app.ui.settings_dialog import SettingsDialog  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Rename the variable `x` to `total` in:\n\ndef add(x, y):\n    x = x + y\n    return x"
SIZE = (1200, 760)
SMALL = (1024, 700)
PROGRESS_SHOWN = 25  # the first-start shot waits for this share of the assembly


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="packaged model key or GGUF")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv[:1])
    app.setApplicationName("Foresight")
    result = {"code": 1}
    folder = Path(HOME.name)
    with ChatStore(folder / "chats.sqlite3") as store:
        window = MainWindow(
            store,
            EngineLaunch(a.target, draft={"mode": "ngram"}),
            sampling=SamplingSettings(temperature=0.0, max_tokens=200),
            api_port=0,
            session=WindowSession(folder / "window.ini"),
        )
        window.resize(*SIZE)
        window.highlight_drafts.setChecked(True)  # the answer's drafted text shows on green
        window.show()
        shot = {"first-start": False}

        def shoot(name: str, widget: QWidget | None = None) -> None:
            path = a.out / f"{name}.png"
            (widget or window).grab().save(str(path))
            print(f"saved {path.relative_to(ROOT)}", flush=True)

        def starting() -> None:
            status = window.status
            assembling = status.stage == "assembling the model" and (status.share or 0) >= PROGRESS_SHOWN
            if assembling and not shot["first-start"]:
                shot["first-start"] = True
                shoot("first-start")

        def ready(_port: int) -> None:
            if not shot["first-start"]:
                print("the model was assembled already: no first-start shot", flush=True)
            window.input.setPlainText(QUESTION)
            QTimer.singleShot(500, window.send)

        def answered(status: str, _usage: dict) -> None:
            if status != "complete":
                print(f"the answer ended {status}")
                app.quit()
                return
            QTimer.singleShot(500, serve)

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
            QTimer.singleShot(300, devices)

        def devices() -> None:
            shoot("api-server")
            window.api_panel.hide()
            window.devices_panel.scanned.connect(lambda: QTimer.singleShot(300, library))
            window.devices_panel.show()

        def library() -> None:
            shoot("devices")
            window.devices_panel.hide()
            window.resize(*SMALL)
            window.library_panel.fit_scan.scanned.connect(lambda *_: QTimer.singleShot(800, settings))
            window.library_panel.show()  # the first showing sizes the catalog for this machine

        def settings() -> None:
            shoot("library")
            window.library_panel.hide()
            window.resize(*SIZE)
            dialog = SettingsDialog(folder / "config.toml", window)
            dialog.resize(760, 600)
            dialog.show()
            QTimer.singleShot(400, lambda: dark(dialog))

        def dark(dialog: SettingsDialog) -> None:
            shoot("settings", dialog)
            dialog.reject()
            theme.apply("dark")
            QTimer.singleShot(600, last)

        def last() -> None:
            shoot("dark")
            result.update(code=0)
            app.quit()

        window.status.changed.connect(starting)
        window.engine.ready.connect(ready)
        window.conversation.answerFinished.connect(answered)
        window.start_engine()
        QTimer.singleShot(900_000, app.quit)
        app.exec()
        window.close()
        window.library_panel.wait()
    HOME.cleanup()
    return result["code"]


if __name__ == "__main__":
    sys.exit(main())
