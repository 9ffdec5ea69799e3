"""`python -m app` (and the frozen executable without arguments): the desktop window."""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app import keystore, paths
from app.catalog import download
from app.catalog.packaged import DEFAULT_DOWNLOAD, default_model_installed
from app.chats.store import ChatStore
from app.config import SamplingSettings, load_settings
from app.services.engine import EngineLaunch
from app.ui import theme
from app.ui.excepthooks import ExceptionHooks
from app.ui.main_window import MainWindow
from app.ui.session import WindowSession

SMOKE_PROMPT = "Reply with one word: ready?"
SMOKE_TIMEOUT_MS = 300_000


def run(engine_args: list[str], n_ctx: int, sampling: dict, smoke: bool = False) -> int:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Foresight")
    # installed for the life of the process: an exception leaving run() is logged too
    hooks = ExceptionHooks().install()
    store_path = paths.data_dir() / ("smoke-chats.sqlite3" if smoke else "chats.sqlite3")
    store = ChatStore(store_path)
    if smoke:
        sampling = {**sampling, "max_tokens": 8, "temperature": 0.0}
    theme.apply(load_settings().appearance.theme, app)
    launch = EngineLaunch.from_argv(engine_args)
    offer = None
    if launch.target is None and not default_model_installed():
        # the double-click install carries no model: use the downloaded one, or offer the download
        models = load_settings().models.folder()
        repo, name = DEFAULT_DOWNLOAD
        local = download.library_path(models, repo, name)
        if local.is_file():
            launch = launch.with_target(str(local))
        else:
            offer = ([download.FileSpec(repo, name, "target")], models)
    # the installer check keeps its own window state, apart from the user's
    session = WindowSession(paths.data_dir() / "smoke-window.ini") if smoke else None
    window = MainWindow(store, launch, n_ctx=n_ctx, sampling=SamplingSettings(**sampling), session=session)
    hooks.raised.connect(window.banner.say)
    window.show()
    if smoke:
        _smoke(app, window)
    if offer is not None:
        window.first_run.offer(
            *offer, "the default model, Qwen2.5-Coder-1.5B-Instruct (1.1 GB)", keystore.TokenStore().resolve()
        )
    else:
        window.start_engine()
    try:
        return app.exec()
    finally:
        store.close()
        if smoke:
            store_path.unlink(missing_ok=True)
            if session is not None:
                session.path.unlink(missing_ok=True)


def _smoke(app: QApplication, window: MainWindow) -> None:
    """The installer check: the window, its engine and its client answer one real question, then exit."""

    def finish(code: int, why: str) -> None:
        print(f"smoke: {why}", flush=True)
        window.close()
        app.exit(code)

    def answered(status: str, _usage: dict) -> None:
        current = window.conversation.current
        text = window.store.messages(current)[-1].content if current is not None else ""
        if status == "complete" and text.strip():
            finish(0, f"answered {text.strip()[:60]!r}")
        else:
            finish(1, f"the answer ended {status}")

    window.engine.ready.connect(lambda port: window.send(SMOKE_PROMPT))
    window.engine.crashed.connect(lambda code, tail: finish(1, f"the engine crashed ({code}): {tail[-300:]}"))
    window.conversation.answerFinished.connect(answered)
    QTimer.singleShot(SMOKE_TIMEOUT_MS, lambda: finish(1, "no answer in time"))
