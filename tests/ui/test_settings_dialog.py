"""The settings dialogs offscreen: a conversation's against a real SQLite store, the app's against a real
settings file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLabel, QLineEdit, QSpinBox, QWidget
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.config import SamplingSettings, Settings, load_settings, save_settings
from app.ui.settings_dialog import ConversationSettingsDialog, SettingsDialog
from app.ui.settings_pages import APPLIES, ENGINE_RESTART, NOW, pages
from tests.support.chats import fill_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


# --- conversation settings -----------------------------------------------------------------------


def test_conversation_settings_reach_the_store_file(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as store:
        _, rust = fill_store(store)
        dialog = ConversationSettingsDialog(store, rust, defaults=SamplingSettings(temperature=0.7, top_k=12))
        qtbot.addWidget(dialog)
        assert dialog.fields["seed"].text() == "7"
        assert dialog.fields["temperature"].placeholderText() == "app default (0.7)"
        assert dialog.fields["top_k"].placeholderText() == "app default (12)"  # the window's, not the class's
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
    kyoto, _ = fill_store(store)
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
    kyoto, _ = fill_store(store)
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
    assert dialog.tabs.count() == len(pages())
    kinds = {(s, n): type(e.widget) for s, editors in dialog.editors.items() for n, e in editors.items()}
    assert kinds[("draft", "adaptive")] is QCheckBox
    assert kinds[("draft", "mode")] is QComboBox
    assert kinds[("engine", "n_ctx")] is QSpinBox
    assert kinds[("sampling", "top_p")] is QDoubleSpinBox
    assert kinds[("sampling", "seed")] is QLineEdit  # 2**63 - 1 does not fit a spin box
    assert kinds[("engine", "tensor_split")] is QLineEdit
    n_ctx = dialog.editors["engine"]["n_ctx"].widget
    assert (n_ctx.minimum(), n_ctx.maximum()) == (0, 1_048_576)  # 0: sized by the fit
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
    # what the window applies at once, and what it says waits
    assert dialog.sampling_now() == {"top_p": 0.5, "seed": 12345678901234}
    assert dialog.waiting_note() == (
        "Settings saved; restart the engine to use the engine settings and the models folder changes when "
        "Foresight starts again."
    )

    again = SettingsDialog(file)  # opens on what was saved
    qtbot.addWidget(again)
    assert again.settings() == loaded
    assert again.editors["engine"]["tensor_split"].widget.text() == "3, 1"


def test_settings_dialog_models_only_needs_no_engine_restart(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = SettingsDialog(tmp_path / "config.toml")
    qtbot.addWidget(dialog)
    dialog.editors["models"]["hf_cache"].widget.setChecked(False)
    dialog.save_button.click()
    assert dialog.changed_sections == {"models"}
    assert not dialog.restart_needed
    assert dialog.next_start_needed  # the library reads its folders when the window starts
    assert dialog.sampling_now() == {}
    assert dialog.waiting_note() == "Settings saved; the models folder changes when Foresight starts again."


def test_settings_are_grouped_for_people_and_say_when_they_apply(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = SettingsDialog(tmp_path / "config.toml")
    qtbot.addWidget(dialog)
    titles = [dialog.tabs.tabText(i).replace("&&", "&") for i in range(dialog.tabs.count())]
    assert titles == ["Model", "Speed", "Privacy & network", "Appearance", "Advanced"]
    labels = {(s, n): e.label for s, editors in dialog.editors.items() for n, e in editors.items()}
    # words for people, not the config's names
    for raw in ("N batch", "Device argmax", "Mmproj", "N ctx", "Gpu layers", "GPU layers"):
        assert raw not in labels.values()
    assert labels[("engine", "n_batch")] == "Prompt tokens per batch"
    assert labels[("engine", "mmproj")].startswith("Vision projector")
    gpu_layers = dialog.editors["engine"]["gpu_layers"].widget
    assert gpu_layers.value() == -1
    assert gpu_layers.text() == "all"  # not "-1"
    assert dialog.editors["engine"]["n_ctx"].widget.text().startswith("automatic")
    theme = dialog.editors["appearance"]["theme"].widget
    assert [theme.itemText(i) for i in range(theme.count())] == ["system", "light", "dark"]
    # the engine details sit under Advanced
    advanced = dialog.tabs.widget(titles.index("Advanced"))
    assert advanced.isAncestorOf(dialog.editors["engine"]["n_batch"].widget)
    assert not advanced.isAncestorOf(dialog.editors["sampling"]["temperature"].widget)
    # each row says truthfully when it takes effect: the window sends sampling with every question
    assert dialog.rows[("sampling", "temperature")].applies == NOW
    assert dialog.rows[("sampling", "top_k")].applies == NOW
    assert dialog.rows[("sampling", "repeat_last_n")].applies == ENGINE_RESTART  # the engine's alone
    assert dialog.rows[("appearance", "theme")].applies == NOW
    assert dialog.rows[("engine", "n_ctx")].applies == ENGINE_RESTART
    page = dialog.tabs.widget(titles.index("Model"))
    assert APPLIES[NOW] in [w.text() for w in page.findChildren(QLabel)]
    dialog.editors["sampling"]["temperature"].widget.setValue(0.2)
    dialog.save_button.click()
    assert not dialog.restart_needed  # it applies at once, so nothing asks for a restart
    assert dialog.sampling_now() == {"temperature": 0.2}
    assert dialog.waiting_note() is None


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
    assert "Random seed must be from 0 to" in dialog.error.text()
    assert "Share of the model per GPU (e.g. 3, 1) must be a number" in dialog.error.text()
    assert file.read_text() == "[engine]\nn_ctx = 2048\n"


def test_settings_dialog_on_a_broken_file_shows_defaults_and_says_so(qtbot: QtBot, tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text("[engine\n")
    dialog = SettingsDialog(file)
    qtbot.addWidget(dialog)
    assert "could not be read" in dialog.error.text()
    assert dialog.settings() == Settings()


def test_the_dialogs_open_on_their_own_and_go_when_closed(qtbot: QtBot, store: ChatStore) -> None:
    kyoto, _ = fill_store(store)
    parent = QWidget()
    qtbot.addWidget(parent)
    dialog = ConversationSettingsDialog.open_for(store, kyoto, SamplingSettings(max_tokens=64), parent)
    assert dialog.isVisible()
    assert dialog.testAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    assert dialog.fields["max_tokens"].placeholderText() == "app default (64)"
    with qtbot.waitSignal(dialog.destroyed, timeout=10_000):
        dialog.reject()
    settings = SettingsDialog.open_for(parent)
    assert settings.isVisible()
    assert settings.file.name == "config.toml"  # the user's settings file (under the test's home)
    with qtbot.waitSignal(settings.destroyed, timeout=10_000):
        settings.reject()
