"""The dialogs offscreen against a real SQLite store and a real settings file; file dialogs scripted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLineEdit,
    QMenu,
    QMessageBox,
    QSpinBox,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.config import Settings, load_settings, save_settings
from app.paths import write_atomic
from app.ui.dialogs import (
    RESTART_SECTIONS,
    ConversationSettingsDialog,
    DataActions,
    Prompts,
    SettingsDialog,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _fill(store: ChatStore) -> list[int]:
    a = store.create_conversation("Kyoto trip", system_prompt="Be brief.", settings={"temperature": 0.2})
    store.add_message(a.id, "user", "Where to go?\nTwo lines.")
    answer = store.begin_answer(a.id)
    store.update_answer(answer.id, "Fushimi **Inari**", status="complete", stats={"emitted": 3})
    b = store.create_conversation("Rust", settings={"seed": 7, "custom": "kept"})
    store.add_message(b.id, "user", "borrow checker?")
    store.add_message(b.id, "assistant", "half an answer", status="stopped")
    return [a.id, b.id]


def _snapshot(store: ChatStore) -> list[tuple]:
    return [
        (
            c.title,
            c.system_prompt,
            c.settings,
            c.created,
            [(m.role, m.content, m.status, m.images, m.stats, m.created) for m in store.messages(c.id)],
        )
        for c in sorted(store.conversations(), key=lambda c: (c.created, c.title))
    ]


# --- conversation settings -----------------------------------------------------------------------


def test_conversation_settings_reach_the_store_file(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as store:
        _, rust = _fill(store)
        dialog = ConversationSettingsDialog(store, rust, defaults={"temperature": 0.7, "max_tokens": 1024})
        qtbot.addWidget(dialog)
        assert dialog.fields["seed"].text() == "7"
        assert dialog.fields["temperature"].placeholderText() == "app default (0.7)"
        assert "nucleus" in dialog.fields["top_p"].toolTip()
        dialog.system_prompt.setPlainText("Answer in Rust.")
        for name, text in {
            "temperature": "0.3",
            "top_p": "0.9",
            "top_k": "20",
            "min_p": "0.1",
            "repeat_penalty": "1.1",
            "max_tokens": "256",
            "seed": " ",  # blank: back to the app default
        }.items():
            dialog.fields[name].setText(text)
        dialog.save_button.click()
        assert dialog.result() == ConversationSettingsDialog.DialogCode.Accepted
    with ChatStore(path) as reopened:
        conv = reopened.conversation(rust)
    assert conv.system_prompt == "Answer in Rust."
    assert conv.settings == {
        "custom": "kept",  # keys the dialog does not show survive
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.1,
        "repeat_penalty": 1.1,
        "max_tokens": 256,
    }
    assert isinstance(conv.settings["top_k"], int)


@pytest.mark.parametrize(
    ("field", "text", "message"),
    [
        ("temperature", "9", "Temperature must be from 0 to 5"),
        ("temperature", "warm", "Temperature must be a number"),
        ("top_p", "0", "Top p must be above 0 and at most 1"),
        ("top_k", "2.5", "Top k must be a whole number"),
        ("min_p", "nan", "Min p must be a finite number"),
        ("max_tokens", "0", "Max tokens must be from 1 to 1048576"),
        ("seed", "-1", "Seed must be from 0 to 9223372036854775807"),
    ],
)
def test_conversation_settings_refuse_bad_values_and_keep_the_store(
    qtbot: QtBot, store: ChatStore, field: str, text: str, message: str
) -> None:
    kyoto, _ = _fill(store)
    before = store.conversation(kyoto)
    dialog = ConversationSettingsDialog(store, kyoto)
    qtbot.addWidget(dialog)
    dialog.system_prompt.setPlainText("changed")
    dialog.fields[field].setText(text)
    dialog.save_button.click()
    assert dialog.result() != ConversationSettingsDialog.DialogCode.Accepted
    assert not dialog.error.isHidden()
    assert message in dialog.error.text()
    assert store.conversation(kyoto) == before


def test_conversation_settings_use_app_defaults_empties_the_overrides(qtbot: QtBot, store: ChatStore) -> None:
    kyoto, _ = _fill(store)
    dialog = ConversationSettingsDialog(store, kyoto)
    qtbot.addWidget(dialog)
    dialog.defaults_button.click()
    dialog.save_button.click()
    conv = store.conversation(kyoto)
    assert conv.settings == {}
    assert conv.system_prompt == "Be brief."


# --- app settings, generated from app.config -----------------------------------------------------


def test_settings_dialog_has_a_row_for_every_field_by_type(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = SettingsDialog(tmp_path / "config.toml")
    qtbot.addWidget(dialog)
    fields = {(s, n) for s, info in Settings.model_fields.items() for n in info.annotation.model_fields}
    shown = {(s, n) for s, editors in dialog.editors.items() for n in editors}
    assert shown == fields
    assert dialog.tabs.count() == len(Settings.model_fields)
    kinds = {(s, n): type(e.widget) for s, editors in dialog.editors.items() for n, e in editors.items()}
    assert kinds[("draft", "adaptive")] is QCheckBox
    assert kinds[("draft", "mode")] is QComboBox
    assert kinds[("engine", "n_ctx")] is QSpinBox
    assert kinds[("sampling", "top_p")] is QDoubleSpinBox
    assert kinds[("sampling", "seed")] is QLineEdit  # 2**63 - 1 does not fit a spin box
    assert kinds[("engine", "tensor_split")] is QLineEdit
    n_ctx = dialog.editors["engine"]["n_ctx"].widget
    assert (n_ctx.minimum(), n_ctx.maximum()) == (256, 1_048_576)
    assert "context length in tokens" in n_ctx.toolTip()
    mode = dialog.editors["draft"]["mode"].widget
    assert [mode.itemText(i) for i in range(mode.count())] == ["auto", "model", "ngram", "none"]
    assert dialog.settings() == Settings()


def test_settings_dialog_saves_the_file_and_loads_it_back(qtbot: QtBot, tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    dialog = SettingsDialog(file)
    qtbot.addWidget(dialog)
    ed = dialog.editors
    ed["engine"]["n_ctx"].widget.setValue(8192)
    ed["engine"]["tensor_split"].widget.setText("3, 1")
    ed["draft"]["mode"].widget.setCurrentText("ngram")
    ed["draft"]["adaptive"].widget.setChecked(False)
    ed["sampling"]["top_p"].widget.setValue(0.5)
    ed["sampling"]["seed"].widget.setText("12345678901234")
    ed["models"]["dir"].widget.setText("/data/models")
    dialog.save_button.click()
    assert dialog.result() == SettingsDialog.DialogCode.Accepted
    loaded = load_settings(file, environ={})
    assert loaded == dialog.saved
    assert loaded.engine.n_ctx == 8192
    assert loaded.engine.tensor_split == [3.0, 1.0]
    assert (loaded.draft.mode, loaded.draft.adaptive) == ("ngram", False)
    assert loaded.sampling.top_p == 0.5
    assert loaded.sampling.seed == 12345678901234
    assert loaded.models.dir == "/data/models"
    assert dialog.changed_sections == {"engine", "draft", "sampling", "models"}
    assert dialog.restart_needed

    again = SettingsDialog(file)  # opens on what was saved
    qtbot.addWidget(again)
    assert again.settings() == loaded
    assert again.editors["engine"]["tensor_split"].widget.text() == "3, 1"


def test_settings_dialog_models_only_needs_no_restart(qtbot: QtBot, tmp_path: Path) -> None:
    assert "models" not in RESTART_SECTIONS
    dialog = SettingsDialog(tmp_path / "config.toml")
    qtbot.addWidget(dialog)
    dialog.editors["models"]["hf_cache"].widget.setChecked(False)
    dialog.save_button.click()
    assert dialog.changed_sections == {"models"}
    assert not dialog.restart_needed


def test_settings_dialog_restore_defaults(qtbot: QtBot, tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    changed = Settings()
    changed.engine.n_batch = 128
    changed.server.cors_origin = "http://localhost:3000"
    changed.sampling.temperature = 1.5
    save_settings(changed, file)
    dialog = SettingsDialog(file)
    qtbot.addWidget(dialog)
    assert dialog.settings() == changed
    dialog.defaults_button.click()
    assert dialog.editors["server"]["cors_origin"].widget.text() == ""
    assert dialog.settings() == Settings()
    dialog.save_button.click()
    assert load_settings(file, environ={}) == Settings()
    assert dialog.changed_sections == {"engine", "server", "sampling"}


def test_settings_dialog_refuses_bad_values_and_leaves_the_file(qtbot: QtBot, tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text("[engine]\nn_ctx = 2048\n")
    dialog = SettingsDialog(file)
    qtbot.addWidget(dialog)
    dialog.editors["sampling"]["seed"].widget.setText("-3")
    dialog.editors["engine"]["tensor_split"].widget.setText("3, x")
    dialog.editors["draft"]["ngram_min"].widget.setValue(5)
    dialog.save_button.click()
    assert dialog.result() != SettingsDialog.DialogCode.Accepted
    assert "Seed must be from 0 to" in dialog.error.text()
    assert "Tensor split must be a number" in dialog.error.text()
    assert file.read_text() == "[engine]\nn_ctx = 2048\n"


def test_settings_dialog_on_a_broken_file_shows_defaults_and_says_so(qtbot: QtBot, tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text("[engine\n")
    dialog = SettingsDialog(file)
    qtbot.addWidget(dialog)
    assert "could not be read" in dialog.error.text()
    assert dialog.settings() == Settings()


# --- data actions --------------------------------------------------------------------------------


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
    _fill(store)
    out = tmp_path / "export.json"
    prompts = ScriptedPrompts(out)
    assert _actions(qtbot, store, prompts).export_all() == out
    assert json.loads(out.read_text(encoding="utf-8"))["format"] == "foresight-chats"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".export")] == []  # no temp left
    assert prompts.shown[-1] == ("info", f"2 conversation(s) exported to {out}.")

    with ChatStore(tmp_path / "fresh.sqlite3") as fresh:
        actions = _actions(qtbot, fresh, ScriptedPrompts(out))
        with qtbot.waitSignal(actions.storeChanged, timeout=1000):
            assert actions.import_file() == 2
        assert _snapshot(fresh) == _snapshot(store)


def test_markdown_export_of_the_current_conversation(qtbot: QtBot, store: ChatStore, tmp_path: Path) -> None:
    kyoto, rust = _fill(store)
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
    _fill(store)
    before = _snapshot(store)
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    prompts = ScriptedPrompts(bad)
    actions = _actions(qtbot, store, prompts)
    with qtbot.assertNotEmitted(actions.storeChanged):
        assert actions.import_file() == 0
    assert _snapshot(store) == before
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
    _fill(store)
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
        qtbot.waitSignal(actions.deletedAll, timeout=1000),
        qtbot.waitSignal(actions.storeChanged, timeout=1000),
    ):
        assert actions.delete_all()
    assert store.conversations() == []
    assert not damaged.exists()
    store.close()
    with ChatStore(tmp_path / "chats.sqlite3") as reopened:
        assert reopened.conversations() == []


def test_write_atomic_keeps_the_old_file_when_the_write_fails(tmp_path: Path) -> None:
    target = tmp_path / "export.json"
    target.write_text("old")

    with pytest.raises(TypeError):
        write_atomic(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["export.json"]
    write_atomic(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["export.json"]


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
