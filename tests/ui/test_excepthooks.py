"""Uncaught exceptions in the GUI process (offscreen, the real window): one raised in a Qt slot, from the
event loop, or in another thread is logged with its traceback and said in the window's banner, and the
window carries on."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.services.engine import EngineLaunch
from app.ui.excepthooks import ExceptionHooks
from app.ui.main_window import MainWindow
from app.ui.session import WindowSession

# pytest-qt puts its own sys.excepthook in place for each test: these tests are about the app's
pytestmark = pytest.mark.qt_no_exception_capture


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path) -> Iterator[MainWindow]:
    with ChatStore(tmp_path / "chats.sqlite3") as store:
        window = MainWindow(store, EngineLaunch(), session=WindowSession(tmp_path / "window.ini"))
        qtbot.addWidget(window)
        window.show()
        qtbot.waitExposed(window)
        yield window
        window.close()


@pytest.fixture
def hooks(window: MainWindow) -> Iterator[ExceptionHooks]:
    """The hooks as app.ui.app.run installs them, said through the window's banner."""
    before = (sys.excepthook, threading.excepthook)
    hooks = ExceptionHooks().install()
    hooks.raised.connect(window.banner.say)
    yield hooks
    hooks.uninstall()
    assert (sys.excepthook, threading.excepthook) == before


def _logged(caplog: pytest.LogCaptureFixture, kind: type[BaseException]) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and r.exc_info is not None and r.exc_info[0] is kind
    ]


def test_an_exception_in_a_slot_is_logged_and_shown_and_the_window_carries_on(
    qtbot: QtBot, window: MainWindow, hooks: ExceptionHooks, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_checked: bool) -> None:
        raise ValueError("the highlight slot broke")

    window.highlight_drafts.toggled.connect(broken)
    window.highlight_drafts.trigger()  # View > Highlight accepted drafts: Qt calls the slot
    [record] = _logged(caplog, ValueError)
    assert "Uncaught exception" in record.getMessage()
    assert "the highlight slot broke" in caplog.text  # the traceback is in the log
    assert window.banner.isVisible()
    assert "ValueError: the highlight slot broke" in window.banner.text()
    assert "log" in window.banner.text()
    # the window lives on: the window's own slot of the same action ran, and the action works again
    assert window.chat.highlight
    window.highlight_drafts.toggled.disconnect(broken)
    window.highlight_drafts.trigger()
    assert not window.chat.highlight
    assert len(_logged(caplog, ValueError)) == 1
    assert window.isVisible()

    # raised from the event loop itself (a timer's slot): the same
    window.banner.dismiss()
    QTimer.singleShot(0, lambda: 1 / 0)
    qtbot.waitUntil(lambda: "ZeroDivisionError" in window.banner.text(), timeout=5_000)
    assert window.banner.isVisible()
    assert len(_logged(caplog, ZeroDivisionError)) == 1
    assert window.isVisible()


def test_an_exception_in_another_thread_is_logged_and_shown_in_the_window(
    qtbot: QtBot, window: MainWindow, hooks: ExceptionHooks, caplog: pytest.LogCaptureFixture
) -> None:
    def work() -> None:
        raise OSError("the disk went away")

    thread = threading.Thread(target=work, name="scanner")
    thread.start()
    thread.join(10)
    [record] = _logged(caplog, OSError)
    assert record.getMessage() == "Uncaught exception in thread scanner"
    # said in the window from the main thread (a signal queued there), not from the worker
    qtbot.waitUntil(lambda: "OSError: the disk went away" in window.banner.text(), timeout=5_000)
    assert window.banner.isVisible()
    assert window.isVisible()


def test_a_thread_that_exits_says_nothing(
    qtbot: QtBot, window: MainWindow, hooks: ExceptionHooks, caplog: pytest.LogCaptureFixture
) -> None:
    thread = threading.Thread(target=sys.exit, name="leaving")
    thread.start()
    thread.join(10)
    qtbot.wait(50)
    assert not _logged(caplog, SystemExit)
    assert not window.banner.isVisible()
