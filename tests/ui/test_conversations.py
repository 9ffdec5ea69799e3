"""The conversation list (offscreen) over a real SQLite store: the model's rows and roles, the search, and
a view that reports a choice but not the window's own marking of the conversation shown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.ui.conversations import ID_ROLE, UPDATED_ROLE, ConversationList, ConversationsView
from tests.support.chats import fill_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def test_the_model_lists_the_store_newest_first_with_its_roles(qtbot: QtBot, store: ChatStore) -> None:
    kyoto, rust = fill_store(store)
    model = ConversationList(store)
    assert model.rowCount() == 2
    assert model.titles() == ["Rust", "Kyoto trip"]  # newest activity first
    top = model.index(0)
    assert top.data() == top.data(Qt.ItemDataRole.ToolTipRole) == "Rust"
    assert top.data(ID_ROLE) == rust
    assert top.data(UPDATED_ROLE) == store.conversation(rust).updated
    assert model.index(1).data(ID_ROLE) == kyoto
    assert (model.row_of(kyoto), model.row_of(None), model.row_of(12345)) == (1, -1, -1)

    with qtbot.waitSignal(model.modelReset, timeout=10_000):
        model.refresh("inari")  # the search reaches the messages too
    assert model.titles() == ["Kyoto trip"]
    store.add_message(rust, "user", "Inari again")
    model.refresh()  # the search stays until it changes
    assert model.titles() == ["Rust", "Kyoto trip"]


def test_the_view_reports_choices_and_follows_the_conversation_shown(qtbot: QtBot, store: ChatStore) -> None:
    kyoto, rust = fill_store(store)
    view = ConversationsView(ConversationList(store))
    qtbot.addWidget(view)
    view.show()
    with qtbot.assertNotEmitted(view.chosen):
        view.show_current(kyoto)  # the window says what it shows: no choice is reported back
    assert view.list.currentIndex().data(ID_ROLE) == kyoto
    view.model.refresh()  # a new read of the store keeps the mark
    assert view.list.currentIndex().data(ID_ROLE) == kyoto
    with qtbot.waitSignal(view.chosen, timeout=10_000) as chosen:
        view.choose_row(0)
    assert chosen.args == [rust]
    with qtbot.waitSignal(view.newRequested, timeout=10_000):
        view.new_button.click()
    view.search.setText("borrow")
    assert view.model.titles() == ["Rust"]
    view.show_current(kyoto)  # filtered out: nothing is marked
    assert not view.list.currentIndex().isValid()
    view.set_busy(True)
    assert not view.list.isEnabled()
    assert not view.new_button.isEnabled()
    view.set_busy(False)
    assert view.list.isEnabled()
