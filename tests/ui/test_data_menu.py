"""The File menu's data actions offscreen against a real SQLite store; file dialogs and questions scripted
(the real confirmation box is answered by its buttons)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMenu, QMessageBox, QWidget
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.ui.data_menu import DataActions, Prompts
from tests.support.chats import fill_store, snapshot


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


class ScriptedPrompts(Prompts):
    """Answers the file dialogs and confirmations from a script; records every message shown."""

    def __init__(self, path: Path | None = None, confirm: bool = True) -> None:
        self.path = path
        self.answer = confirm
        self.shown: list[tuple[str, str]] = []

    def save_path(self, parent: QWidget | None, title: str, suggested: Path, file_filter: str) -> Path | None:
        self.shown.append(("save", suggested.name))
        return self.path

    def open_path(self, parent: QWidget | None, title: str, file_filter: str) -> Path | None:
        return self.path

    def confirm(self, parent: QWidget | None, title: str, text: str, action: str) -> bool:
        self.shown.append(("confirm", text))
        return self.answer

    def inform(self, parent: QWidget | None, title: str, text: str) -> None:
        self.shown.append(("info", text))

    def warn(self, parent: QWidget | None, title: str, text: str) -> None:
        self.shown.append(("warn", text))


def _actions(qtbot: QtBot, store: ChatStore, prompts: Prompts, current: int | None = None) -> DataActions:
    window = QWidget()
    qtbot.addWidget(window)
    return DataActions(store, window, lambda: current, prompts)


def test_export_json_then_import_into_a_fresh_store(qtbot: QtBot, store: ChatStore, tmp_path: Path) -> None:
    fill_store(store)
    out = tmp_path / "export.json"
    prompts = ScriptedPrompts(out)
    assert _actions(qtbot, store, prompts).export_all() == out
    assert json.loads(out.read_text(encoding="utf-8"))["format"] == "foresight-chats"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".export")] == []  # no temp left
    assert prompts.shown[-1] == ("info", f"2 conversation(s) exported to {out}.")

    with ChatStore(tmp_path / "fresh.sqlite3") as fresh:
        actions = _actions(qtbot, fresh, ScriptedPrompts(out))
        with qtbot.waitSignal(actions.storeChanged, timeout=10_000):
            assert actions.import_file() == 2
        assert snapshot(fresh) == snapshot(store)


def test_markdown_export_of_the_current_conversation(qtbot: QtBot, store: ChatStore, tmp_path: Path) -> None:
    kyoto, rust = fill_store(store)
    out = tmp_path / "kyoto.md"
    prompts = ScriptedPrompts(out)
    assert _actions(qtbot, store, prompts, current=kyoto).export_current() == out
    assert prompts.shown == [("save", "Kyoto trip.md")]
    assert out.read_text(encoding="utf-8") == (
        "# Kyoto trip\n\n**System:** Be brief.\n\n"
        "## User\n\nWhere to go?\nTwo lines.\n\n## Assistant\n\nFushimi **Inari**\n"
    )
    _actions(qtbot, store, ScriptedPrompts(out), current=rust).export_current()
    assert "## Assistant *(stopped)*\n\nhalf an answer" in out.read_text(encoding="utf-8")

    nothing = ScriptedPrompts(out)
    assert _actions(qtbot, store, nothing, current=None).export_current() is None
    assert nothing.shown == [("info", "Choose a conversation to export first.")]


def test_markdown_action_follows_the_current_conversation(qtbot: QtBot, store: ChatStore) -> None:
    current: list[int | None] = [None]
    window = QWidget()
    qtbot.addWidget(window)
    actions = DataActions(store, window, lambda: current[0], ScriptedPrompts())
    menu = QMenu(window)
    actions.add_to_menu(menu)
    assert len([a for a in menu.actions() if not a.isSeparator()]) == 4
    menu.aboutToShow.emit()
    assert not actions.export_markdown_action.isEnabled()
    current[0] = store.create_conversation().id
    menu.aboutToShow.emit()
    assert actions.export_markdown_action.isEnabled()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "is not JSON (line 1"),
        (b"\xff\xfe\x00garbage", "is not a text file"),
        (b'{"format": "something-else", "conversations": []}', "not a Foresight chat export"),
        (b'{"format": "foresight-chats"}', "no 'conversations' list"),
        (b'{"format": "foresight-chats", "conversations": [5]}', "conversation 1 is not an object"),
        (
            b'{"format": "foresight-chats", "conversations": [{"title": "ok", "messages": []},'
            b' {"title": "bad", "settings": [1], "messages": []}]}',
            "the settings of conversation 2 are not an object",
        ),
        (  # the first conversation is fine, the second fails inside the store's transaction
            b'{"format": "foresight-chats", "conversations": [{"title": "ok", "messages":'
            b' [{"role": "user", "content": "hi"}]}, {"title": "bad", "messages": [{"role": "robot",'
            b' "content": "x"}]}]}',
            "conversation 2 of the import is malformed",
        ),
    ],
)
def test_a_bad_import_file_leaves_the_store_unchanged(
    qtbot: QtBot, store: ChatStore, tmp_path: Path, content: bytes, message: str
) -> None:
    fill_store(store)
    before = snapshot(store)
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    prompts = ScriptedPrompts(bad)
    actions = _actions(qtbot, store, prompts)
    with qtbot.assertNotEmitted(actions.storeChanged):
        assert actions.import_file() == 0
    assert snapshot(store) == before
    kind, text = prompts.shown[-1]
    assert kind == "warn"
    assert message in text
    assert text.startswith("bad.json")
    assert text.endswith("Nothing was imported.")


def test_import_of_a_missing_file_says_so(qtbot: QtBot, store: ChatStore, tmp_path: Path) -> None:
    prompts = ScriptedPrompts(tmp_path / "gone.json")
    assert _actions(qtbot, store, prompts).import_file() == 0
    assert prompts.shown[-1][0] == "warn"
    assert "gone.json could not be read" in prompts.shown[-1][1]


def test_delete_all_names_what_goes_and_empties_the_store(
    qtbot: QtBot, store: ChatStore, tmp_path: Path
) -> None:
    fill_store(store)
    damaged = tmp_path / "chats.damaged-20240101-000000.sqlite3"
    damaged.write_bytes(b"old conversations")
    refused = ScriptedPrompts(confirm=False)
    assert not _actions(qtbot, store, refused).delete_all()
    assert len(store.conversations()) == 2
    assert damaged.exists()
    text = refused.shown[0][1]
    assert "all 2 conversation(s) and their 4 message(s)" in text
    assert str(store.path) in text
    assert damaged.name in text
    assert "not touched" in text

    actions = _actions(qtbot, store, ScriptedPrompts(confirm=True))
    with (
        qtbot.waitSignal(actions.deletedAll, timeout=10_000),
        qtbot.waitSignal(actions.storeChanged, timeout=10_000),
    ):
        assert actions.delete_all()
    assert store.conversations() == []
    assert not damaged.exists()
    store.close()
    with ChatStore(tmp_path / "chats.sqlite3") as reopened:
        assert reopened.conversations() == []


@pytest.mark.timeout(30)  # a box left open would block until then
def test_the_real_confirmation_box_answers_by_its_named_button(qtbot: QtBot) -> None:
    seen: list[str] = []

    def click(cancel: bool) -> None:
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox)
        seen.append(box.text())
        if cancel:
            box.button(QMessageBox.StandardButton.Cancel).click()
        else:
            next(b for b in box.buttons() if b.text() == "Delete everything").click()

    for cancel in (False, True):
        QTimer.singleShot(50, lambda cancel=cancel: click(cancel))
        assert Prompts().confirm(None, "Delete", "names what goes", "Delete everything") is not cancel
    assert seen == ["names what goes"] * 2
