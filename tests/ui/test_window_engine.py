"""The window with its engine (offscreen, gemma-3-270m on the CPU): the header says what is loaded and
what the engine is doing, the keyboard stays in the question box, and the counts and figures shown are
the conversation's own, while an answer streams and after it stops."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.config import SamplingSettings
from app.services.engine import READY, EngineLaunch
from app.ui.main_window import MainWindow
from app.ui.session import WindowSession

START_MS = 300_000  # generous: a model loads, calibrates and answers slowly on a busy 2-core machine
ANSWER_MS = 300_000  # generous: a model loads, calibrates and answers slowly on a busy 2-core machine


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _ask(qtbot: QtBot, window: MainWindow, text: str) -> str:
    window.input.setPlainText(text)
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.send_button.click()
    return done.args[0]


def test_the_header_tells_the_start_stages_then_the_model_its_device_drafter_and_context(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    # no context length given: the engine sizes it from the fit, and the window does not know it yet
    launch = EngineLaunch(str(gemma_path), draft={"mode": "ngram"}, engine={"n_threads": 1})
    window = MainWindow(
        store,
        launch,
        sampling=SamplingSettings(temperature=0.0, max_tokens=8),
        session=WindowSession(tmp_path / "window.ini"),
        api_port=0,
    )
    qtbot.addWidget(window)
    window.show()
    header = window.chat.header
    assert "of … tokens" in window.input.count.text()  # unknown, never "of 0 tokens"
    states: list[str] = []
    window.status.changed.connect(lambda: states.append(header.state.text()))
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.start_engine()
    qtbot.waitUntil(lambda: bool(window.status.props), timeout=30_000)
    # the start, stage by stage, from the engine's own log lines
    assert "Starting: loading the model…" in states
    assert "Starting: measuring this machine's speed for drafting…" in states
    assert states.index("Starting: loading the model…") < states.index(
        "Starting: measuring this machine's speed for drafting…"
    )
    assert header.state.text() == "Ready"
    assert not header.progress.isVisible()
    props = window.status.props
    n_ctx = props["target"]["n_ctx"]
    assert n_ctx > 0
    assert header.model.text() == props["target"]["name"]
    assert "gemma" in header.model.text().lower()
    details = header.details.text()
    assert "on CPU" in details
    assert "drafts by n-gram lookup" in details
    assert f"context {n_ctx:,} tokens" in details
    assert f"of {n_ctx:,} tokens" in window.input.count.text()
    log = window.log_panel.view.toPlainText()
    assert "foresight.worker: model: loading target" in log  # the Engine log shows its INFO lines
    assert "ready on port" in log
    with qtbot.waitSignal(window.library_panel.visibilityChanged, timeout=10_000):
        header.pick.click()  # the model picker opens the library
    assert window.library_panel.isVisible()
    window.library_panel.hide()
    window.close()
    window.library_panel.wait()


def test_focus_stays_in_the_box_and_the_figures_shown_are_the_conversation_s(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    launch = EngineLaunch(str(gemma_path), draft={"mode": "ngram"}, engine={"n_ctx": 2048, "n_threads": 1})
    window = MainWindow(
        store,
        launch,
        sampling=SamplingSettings(temperature=0.0, max_tokens=24),
        session=WindowSession(tmp_path / "window.ini"),
        api_port=0,
    )
    qtbot.addWidget(window)
    window.show()
    window.activateWindow()
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.start_engine()
    window.new_chat()
    # an empty chat has nothing to edit or answer again
    assert window.send_button.isEnabled()
    assert not window.regenerate_button.isEnabled()
    assert not window.edit_button.isEnabled()

    window.input.setFocus()
    window.input.setPlainText("The capital of France is")
    writing: list[str] = []
    counts: list[str] = []
    window.conversation.answerGrew.connect(lambda: writing.append(window.chat.header.state.text()))
    window.conversation.answerGrew.connect(lambda: counts.append(window.input.count.text()))
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS):
        window.send_button.click()
        # typing on after Send goes to the question box, not to "Search conversations"
        assert QApplication.focusWidget() is window.input.edit
        qtbot.keyClicks(QApplication.focusWidget(), "next")
    assert window.conversations.search.text() == ""
    assert window.input.toPlainText() == "next"
    assert window.conversations.model.titles() == ["The capital of France is"]  # still listed
    assert set(writing) == {"Writing the answer…"}  # the streaming indicator
    assert counts
    assert all(not c.startswith("context: 0 ") for c in counts)  # counted while it streams
    first = window.conversation.current
    first_stats = window.stats_label.text()
    assert "tokens" in first_stats
    assert "tokens per target pass" in window.stats_label.toolTip()  # the figures explained
    window.input.clear()

    window.new_chat()
    assert window.stats_label.text() == ""  # no other chat's figures
    window.input.setPlainText("Write a long story about a lighthouse keeper.")
    window.conversation.sampling = SamplingSettings(temperature=0.0, max_tokens=400)
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.send_button.click()
        qtbot.waitUntil(lambda: len(window.conversation.answer_text) > 40, timeout=ANSWER_MS)
        window.stop_button.click()
    assert done.args[0] == "stopped"
    count = window.input.count.text()
    assert not count.startswith("context: 0 ")  # stopped: the count is estimated, not dropped
    assert "(estimate)" in count
    assert window.continue_button.isVisible()  # a stopped answer can be carried on
    window.conversation.select(first)
    assert window.stats_label.text() == first_stats  # the shown chat's own figures
    window.highlight_drafts.setChecked(True)
    assert window.chat.header.legend.isVisible()  # what the highlight means, said where it shows
    assert "accepted from drafts" in window.chat.header.legend.text()
    assert window.engine.state == READY
    window.close()


def test_a_pair_loaded_from_the_library_shows_its_stages_in_the_header(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    launch = EngineLaunch(str(gemma_path), draft={"mode": "none"}, engine={"n_ctx": 1024, "n_threads": 1})
    window = MainWindow(store, launch, session=WindowSession(tmp_path / "window.ini"), api_port=0)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.start_engine()
    qtbot.waitUntil(lambda: bool(window.status.props), timeout=30_000)
    assert "no drafting" in window.chat.header.details.text()
    panel = window.library_panel
    panel.local_files.import_file(gemma_path)
    wanted = str(gemma_path.resolve())
    qtbot.waitUntil(lambda: panel.picker.target_choice.findData(wanted) >= 0, timeout=60_000)
    panel.picker.choose(wanted, "ngram")
    qtbot.waitUntil(lambda: panel.picker.target_choice.currentData() == wanted, timeout=60_000)
    states: list[str] = []
    window.status.changed.connect(lambda: states.append(window.chat.header.state.text()))
    with qtbot.waitSignal(panel.loader.pairLoaded, timeout=START_MS):
        panel.loader.use_pair()
    qtbot.waitUntil(lambda: "drafts by n-gram lookup" in window.chat.header.details.text(), timeout=30_000)
    assert any(s.startswith("Loading: loading the model") for s in states)
    assert window.chat.header.state.text() == "Ready"
    assert window.chat.header.progress.isHidden()
    window.close()
    panel.wait()
