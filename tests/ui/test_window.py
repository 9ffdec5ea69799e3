"""The window without an engine (offscreen): a layout that holds at 1024x700, banners with a close button,
a scope and the palette's colours, what comes back on relaunch, settings that apply at once, the API
panel's key, the conversation list, the question box's images, and the engine status read from the
engine's own log lines."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QImage, QPalette
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.config import SamplingSettings
from app.logs import FORMAT
from app.services.api_server import MASK, ApiKeys
from app.services.client import EngineClient
from app.services.engine import EngineLaunch, EngineProcess, stop_reason
from app.services.engine_status import EngineStatus
from app.ui import theme
from app.ui.api_panel import ApiServerPanel
from app.ui.composer import Composer
from app.ui.main_window import MainWindow
from app.ui.session import ApiSwitch, WindowSession
from app.ui.settings_dialog import SettingsDialog

SMALL = (1024, 700)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


@pytest.fixture
def light() -> Iterator[None]:
    theme.apply("light")
    yield
    theme.apply("system")


def _window(qtbot: QtBot, store: ChatStore, session: Path, **kw) -> MainWindow:
    window = MainWindow(store, EngineLaunch(), session=WindowSession(session), **kw)
    qtbot.addWidget(window)
    return window


def _file_keys(tmp_path: Path) -> ApiKeys:
    from keyrings.alt.file import PlaintextKeyring

    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")
    return ApiKeys(backend)


def test_panels_open_beside_the_chat_without_widening_a_1024_by_700_window(
    qtbot: QtBot, store: ChatStore, tmp_path: Path
) -> None:
    window = _window(qtbot, store, tmp_path / "window.ini", api_port=0)
    assert window.api_panel.port.value() == 0  # nothing saved yet: the window's own port holds
    window.resize(*SMALL)
    window.show()
    qtbot.waitExposed(window)
    assert window.minimumSizeHint().width() <= SMALL[0]
    for panel in (window.library_panel, window.api_panel, window.devices_panel, window.log_panel):
        panel.show()
        QApplication.processEvents()
        assert (window.width(), window.height()) == SMALL, f"{panel.windowTitle()} widened the window"
        assert window.conversations.width() >= 160, f"{panel.windowTitle()} squeezed the sidebar"
        assert window.chat.width() >= 360
        panel.hide()
    window.library_panel.show()
    window.api_panel.show()  # two panels: tabs of one side stack, not two columns
    QApplication.processEvents()
    assert window.library_panel in window.tabifiedDockWidgets(window.api_panel)
    assert window.width() == SMALL[0]
    window.close()
    window.library_panel.wait()


def test_a_banner_has_a_close_button_a_scope_and_the_palette_s_colours(
    qtbot: QtBot, store: ChatStore, tmp_path: Path, light: None
) -> None:
    first = store.create_conversation("First").id
    store.add_message(first, "user", "hello")
    second = store.create_conversation("Second").id
    store.add_message(second, "user", "hi")
    window = _window(qtbot, store, tmp_path / "window.ini")
    window.show()
    banner = window.banner
    window.conversation.select(first)
    banner.say("Something about the first chat only.", scope=first)
    assert banner.isVisible()
    window.conversation.select(second)
    assert not banner.isVisible()  # it belongs to the first chat
    window.conversation.select(first)
    assert banner.isVisible()  # and comes back with it
    light_background = theme.tone("error").background
    assert light_background in banner.styleSheet()
    theme.apply("dark")
    QApplication.processEvents()
    assert theme.tone("error").background in banner.styleSheet()
    assert theme.tone("error").background != light_background  # no light pink on a dark window
    assert QColor(theme.tone("error").background).lightness() < 128
    assert banner.close_button.isVisible()
    banner.close_button.click()
    assert not banner.isVisible()
    window.conversation.select(second)
    window.conversation.select(first)
    assert not banner.isVisible()  # closed is closed
    window.close()


def test_the_window_comes_back_as_it_was_left_with_an_interrupted_answer_to_continue(
    qtbot: QtBot, tmp_path: Path
) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as store:
        older = store.create_conversation("Older").id
        store.add_message(older, "user", "first question")
        store.add_message(older, "assistant", "first answer")
        story = store.create_conversation("Story").id
        store.add_message(story, "user", "Tell me a story")
        answer = store.begin_answer(story)
        store.update_answer(answer.id, "Once upon a time")  # the window died while it streamed
        window = _window(qtbot, store, tmp_path / "window.ini", api_keys=_file_keys(tmp_path))
        window.show()
        window.resize(800, 590)  # within the offscreen screen (800x600): restored as it was
        window.library_panel.show()
        window.conversation.select(story)
        window.api_panel.port.setValue(8123)
        window.api_panel.toggle.click()  # on: it opens when an engine is ready
        window.close()
        window.library_panel.wait()
    with ChatStore(path) as store:  # a new start: the streaming answer was marked interrupted
        assert store.messages(story)[-1].status == "interrupted"
        again = _window(qtbot, store, tmp_path / "window.ini", api_keys=_file_keys(tmp_path))
        again.show()
        QApplication.processEvents()
        assert (again.width(), again.height()) == (800, 590)
        assert again.library_panel.isVisible()
        assert again.conversation.current == story  # the last chat, selected
        assert again.conversations.list.currentIndex().data() == "Story"
        assert "Once upon a time" in again.transcript.toPlainText()
        assert again.api_panel.switch() == ApiSwitch(on=True, port=8123, lan=False)
        assert again.api_panel.toggle.isChecked()
        assert "starts when the engine is ready" in again.api_panel.status.text()
        banner = again.banner
        assert banner.isVisible()
        assert "cut short" in banner.text()
        assert banner.continue_button.isVisible()
        assert banner.regenerate_button.isVisible()
        assert banner.scope == story
        assert again.continue_button.isVisible()  # beside Regenerate, under the box
        again.conversation.select(older)
        assert not banner.isVisible()  # the notice is the story's
        assert not again.continue_button.isVisible()
        again.close()
        again.library_panel.wait()


def test_settings_that_apply_at_once_do_and_the_theme_follows(
    qtbot: QtBot, store: ChatStore, tmp_path: Path, light: None
) -> None:
    window = _window(qtbot, store, tmp_path / "window.ini", sampling=SamplingSettings(temperature=0.7))
    dialog = SettingsDialog(tmp_path / "config.toml", window)
    editors = dialog.editors
    editors["sampling"]["temperature"].widget.setValue(0.2)
    editors["sampling"]["top_k"].widget.setValue(12)
    editors["sampling"]["min_p"].widget.setValue(0.1)
    editors["appearance"]["theme"].widget.setCurrentText("dark")
    dialog.save_button.click()
    window._settings_saved(dialog)
    sent = window.conversation.request_sampling()
    assert {"temperature": 0.2, "top_k": 12, "min_p": 0.1}.items() <= sent.items()
    assert not window.banner.isVisible()  # nothing waits for a restart
    assert QApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128
    window.close()


def test_the_api_panel_shows_the_key_only_when_asked_and_speaks_plainly(tmp_path: Path, qtbot: QtBot) -> None:
    from keyring.backends import fail

    keys = _file_keys(tmp_path)
    key = keys.key()[0]
    panel = ApiServerPanel(EngineClient(), keys)
    qtbot.addWidget(panel)
    panel.lan.setChecked(True)
    for name in ("Continue", "Zed", "Cline", "aider", "Any OpenAI client", "curl"):
        panel.client_choice.setCurrentText(name)
        assert key not in panel.config.toPlainText(), name
    panel.client_choice.setCurrentText("curl")
    assert MASK in panel.config.toPlainText()
    assert panel.key.echoMode() == panel.key.EchoMode.Password
    panel.copy.click()
    assert key in QApplication.clipboard().text()  # what is copied works as pasted
    panel.show_key.click()
    assert key in panel.config.toPlainText()
    assert panel.key.echoMode() == panel.key.EchoMode.Normal
    assert panel.key_note.text().startswith("The key is kept in your system keyring")
    no_keyring = ApiServerPanel(panel.client, ApiKeys(fail.Keyring()))
    qtbot.addWidget(no_keyring)
    no_keyring.lan.setChecked(True)
    note = no_keyring.key_note.text()
    assert note.startswith("No safe keyring was found on this computer")
    assert no_keyring.keys.why_not  # the keyring's own words (a backend's class name)...
    assert no_keyring.keys.why_not not in note  # ...are not the words for people
    assert "The key is no" not in note
    assert no_keyring.key_note.toolTip()  # the keyring's own words, for those who want them
    panel.lan.setChecked(False)
    assert not panel.key.isEnabled()
    assert panel.key.toolTip()  # greyed, with the reason


def test_the_conversation_list_elides_titles_and_empty_chats_do_not_pile_up(
    qtbot: QtBot, store: ChatStore, tmp_path: Path
) -> None:
    long = store.create_conversation("A very long title " * 8).id
    store.add_message(long, "user", "x")
    window = _window(qtbot, store, tmp_path / "window.ini")
    window.resize(*SMALL)
    window.show()
    view = window.conversations.list
    assert view.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    assert view.textElideMode() == Qt.TextElideMode.ElideRight
    QApplication.processEvents()
    assert not view.horizontalScrollBar().isVisible()
    assert window.conversations.model.data(window.conversations.model.index(0), Qt.ItemDataRole.ToolTipRole)
    window.conversations.new_button.click()
    window.conversations.new_button.click()
    window.new_chat()
    assert len(store.conversations()) == 2  # one new, empty chat however often New is pressed
    empty = window.conversation.current
    # in an empty chat there is nothing to edit, regenerate or continue
    assert not window.edit_button.isEnabled()
    assert not window.regenerate_button.isEnabled()
    assert not window.continue_button.isVisible()
    window.conversation.select(long)
    assert [c.id for c in store.conversations()] == [long]  # the empty one went when it was left
    assert empty not in [c.id for c in store.conversations()]
    window.close()


def test_the_question_box_attaches_images_by_button_and_drop_and_warns_without_vision(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    picture = QImage(16, 16, QImage.Format.Format_RGB32)
    picture.fill(QColor("blue"))
    png = tmp_path / "blue.png"
    assert picture.save(str(png))
    composer = Composer()
    qtbot.addWidget(composer)
    composer.show()
    assert not composer.attach.icon().isNull()  # the paperclip
    assert "Attach" in composer.attach.text()
    # the user's choice in the file dialog (the one edge a test cannot click through)
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(png)], ""))
    composer.attach.click()
    assert len(composer.images) == 1
    drop = QMimeData()
    drop.setUrls([QUrl.fromLocalFile(str(png))])
    enter = QDragEnterEvent(
        QPoint(5, 5), Qt.DropAction.CopyAction, drop, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier
    )
    QApplication.sendEvent(composer, enter)  # a drag comes in first, as the user's does
    assert enter.isAccepted()
    event = QDropEvent(
        QPoint(5, 5), Qt.DropAction.CopyAction, drop, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier
    )
    QApplication.sendEvent(composer, event)  # on the box as a whole, not only its text
    assert len(composer.images) == 2
    assert not composer.no_vision.isVisible()
    composer.set_vision(False)  # the engine said: no vision projector
    assert composer.no_vision.isVisible()
    asked: list[bool] = []
    composer.libraryRequested.connect(lambda: asked.append(True))
    composer.no_vision.linkActivated.emit("library:images")
    assert asked == [True]
    composer.remove_image(0)
    composer.remove_image(0)
    assert not composer.no_vision.isVisible()  # gone with the images


def test_the_status_reads_the_engine_s_own_log_lines(qtbot: QtBot) -> None:
    engine = EngineProcess()
    status = EngineStatus(engine, EngineClient())
    formatter = logging.Formatter(FORMAT, "%H:%M:%S")

    def line(name: str, message: str) -> str:  # as the engine process prints it (app.logs)
        return formatter.format(logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None))

    seen: list[str] = []
    status.changed.connect(lambda: seen.append(status.state_text()))
    engine._set_state("starting")
    for text in (
        line("foresight.worker", "model: assembling the model"),
        line("foresight.assembly", "assembling qwen.gguf: 42% of 1065 MiB"),
        line("foresight.worker", "model: finding devices"),
        line("foresight.worker", "model: loading target"),
        line("foresight.worker", "model: calibrating"),
    ):
        engine.logLine.emit(text)
    assert seen[-4:] == [
        "Starting: assembling the model from its installed parts (first start only), 42%…",
        "Starting: finding this machine's devices…",
        "Starting: loading the model…",
        "Starting: measuring this machine's speed for drafting…",
    ]
    assert status.n_ctx is None  # unknown until /props says


def test_a_crash_is_told_by_its_reason_not_its_last_line() -> None:
    ready = ["12:00:01 INFO    foresight.serve: ready on port 4242", "READY port=4242"]
    assert stop_reason(ready, -1).startswith("it was killed")
    refused = ["READY port=4242", "error: the model file is not GGUF: broken.gguf"]
    assert stop_reason(refused, 2) == "the model file is not GGUF: broken.gguf"
    logged = ["12:00:01 ERROR   foresight.worker: load: out of memory", "READY port=1"]
    assert stop_reason(logged, 1) == "load: out of memory"
    traced = ["Traceback (most recent call last):", '  File "x.py", line 1', "MemoryError: no room"]
    assert stop_reason(traced, 1) == "MemoryError: no room"
