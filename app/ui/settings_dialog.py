"""The settings dialogs, generated from app.config's typed fields: the app's (grouped for people by
app.ui.settings_pages) and one conversation's."""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import paths
from app.chats.store import ChatStore
from app.config import (
    ENV_PREFIX,
    ConfigError,
    SamplingSettings,
    Section,
    Settings,
    load_settings,
    save_settings,
)
from app.ui import theme
from app.ui.field_editor import Bounds, FieldEditor, InvalidValue, parse_number, plain_type, shown_number
from app.ui.panel import scrolled
from app.ui.settings_pages import APPLIES, ENGINE_RESTART, NEXT_START, Page, Row, pages

# --- one conversation's settings ----------------------------------------------------------------

CONVERSATION_FIELDS = {
    "temperature": "Temperature",
    "top_p": "Top p",
    "top_k": "Top k",
    "min_p": "Min p",
    "repeat_penalty": "Repeat penalty",
    "max_tokens": "Max tokens",
    "seed": "Seed",
}


class ConversationSettingsDialog(QDialog):
    """A conversation's system prompt and sampling; an empty field leaves the app's default in force.

    Save writes `system_prompt` and `settings` to the store (keys of `settings` this dialog does not
    show are kept); bounds and help come from app.config's SamplingSettings.
    """

    def __init__(
        self,
        store: ChatStore,
        conversation_id: int,
        defaults: SamplingSettings | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.conversation_id = conversation_id
        conv = store.conversation(conversation_id)
        self.setWindowTitle(f"Settings of “{conv.title}”")
        self.system_prompt = QPlainTextEdit(conv.system_prompt)
        self.system_prompt.setPlaceholderText("No system prompt")
        self.system_prompt.setTabChangesFocus(True)
        form = QFormLayout()
        form.addRow("System prompt", self.system_prompt)
        self.fields: dict[str, QLineEdit] = {}
        for name, label in CONVERSATION_FIELDS.items():
            info = SamplingSettings.model_fields[name]
            default = getattr(defaults or SamplingSettings(), name)
            value = conv.settings.get(name)
            edit = QLineEdit("" if value is None else str(value))
            edit.setClearButtonEnabled(True)
            edit.setPlaceholderText(f"app default ({'unset' if default is None else shown_number(default)})")
            edit.setToolTip(f"{info.description}\n{Bounds.of(info).describe()}; empty: the app's default")
            form.addRow(label, edit)
            self.fields[name] = edit
        self.error = QLabel(wordWrap=True, styleSheet=theme.error_text())
        self.error.hide()
        buttons, self.save_button, self.defaults_button = _save_cancel_defaults(
            self, "Empty every sampling field (the system prompt stays)", self.use_app_defaults
        )
        self.defaults_button.setText("Use app defaults")
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    @classmethod
    def open_for(
        cls, store: ChatStore, conversation_id: int, defaults: SamplingSettings, parent: QWidget
    ) -> ConversationSettingsDialog:
        """Open the dialog (window-modal; it deletes itself when closed) and return it."""
        return _opened(cls(store, conversation_id, defaults, parent))

    def use_app_defaults(self) -> None:
        for edit in self.fields.values():
            edit.clear()

    def values(self) -> dict[str, int | float]:
        """The sampling overrides typed in; InvalidValue names every field that is wrong."""
        out: dict[str, int | float] = {}
        problems: list[str] = []
        for name, edit in self.fields.items():
            if not edit.text().strip():
                continue
            info = SamplingSettings.model_fields[name]
            kind, _ = plain_type(info.annotation)
            try:
                out[name] = parse_number(edit.text(), kind, Bounds.of(info), CONVERSATION_FIELDS[name])
            except InvalidValue as exc:
                problems.append(str(exc))
        if problems:
            raise InvalidValue("\n".join(problems))
        return out

    def accept(self) -> None:
        try:
            overrides = self.values()
        except InvalidValue as exc:
            self._show_error(str(exc))
            return
        kept = {
            k: v
            for k, v in self.store.conversation(self.conversation_id).settings.items()
            if k not in CONVERSATION_FIELDS
        }
        prompt = self.system_prompt.toPlainText()
        self.store.update_conversation(
            self.conversation_id,
            system_prompt=prompt if prompt.strip() else "",
            settings={**kept, **overrides},
        )
        super().accept()

    def _show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()
        bad = next((e for n, e in self.fields.items() if CONVERSATION_FIELDS[n] + " " in text), None)
        if bad is not None:
            bad.setFocus()
            bad.selectAll()


# --- the app settings: every field of app.config.Settings, grouped for people --------------------

SECTION_TITLES = {
    "engine": "Engine",
    "draft": "Drafting",
    "sampling": "Answers",
    "server": "API server",
    "models": "Models",
    "appearance": "Appearance",
}


class SettingsDialog(QDialog):
    """The app settings on pages for people (Model, Speed, Privacy & network, Appearance, and the engine
    details under Advanced: app.ui.settings_pages), each row saying when a change takes effect.

    Save validates through app.config and writes the user's settings file with its save_settings.
    Afterwards `saved` holds the new Settings, `changed` the (section, field) pairs that changed,
    `changed_sections` their sections, and `restart_needed` whether the engine has to restart to use
    them (`next_start_needed`: whether Foresight has).
    """

    def __init__(self, file: Path | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.file = file if file is not None else paths.config_file()
        self.changed: set[tuple[str, str]] = set()
        problem = ""
        try:
            # the file alone: the environment's overrides apply at run time, they are not saved
            self.loaded = load_settings(self.file, environ={})
        except ConfigError as exc:
            self.loaded = Settings()
            problem = (
                f"The settings file could not be read ({exc}). The defaults are shown; Save replaces it."
            )
        self.saved: Settings = self.loaded
        self.editors: dict[str, dict[str, FieldEditor]] = {s: {} for s in Settings.model_fields}
        self.rows: dict[tuple[str, str], Row] = {}
        self.tabs = QTabWidget()
        for page in pages():
            self.tabs.addTab(self._page(page), page.title.replace("&", "&&"))  # "&" alone marks a shortcut
        self.show_settings(self.loaded)

        note = f"Saved to {self.file}."
        overridden = sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and "__" in k)
        if overridden:
            note += " Set in the environment, which wins over the file: " + ", ".join(overridden) + "."
        self.note = QLabel(note, wordWrap=True)
        self.error = QLabel(problem, wordWrap=True, styleSheet=theme.error_text())
        self.error.setVisible(bool(problem))
        buttons, self.save_button, self.defaults_button = _save_cancel_defaults(
            self, "Put every field back to its default (nothing is saved until Save)", self.restore_defaults
        )
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.note)
        self.setMinimumWidth(560)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    def _page(self, page: Page) -> QWidget:
        body = QWidget()
        form = QFormLayout(body)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.addRow(QLabel(page.intro, wordWrap=True))
        for row in page.rows:
            model = Settings.model_fields[row.section].annotation
            assert isinstance(model, type)
            assert issubclass(model, Section)
            editor = FieldEditor(row.section, row.name, model.model_fields[row.name])
            editor.label = row.label
            if row.lowest and isinstance(editor.widget, QSpinBox | QDoubleSpinBox):
                editor.widget.setSpecialValueText(row.lowest)
            when = QLabel(APPLIES[row.applies])
            when.setForegroundRole(QPalette.ColorRole.PlaceholderText)
            line = QHBoxLayout()
            line.addWidget(editor.widget, 1)
            line.addWidget(when)
            form.addRow(row.label, line)
            self.editors[row.section][row.name] = editor
            self.rows[(row.section, row.name)] = row
        return scrolled(body, min_width=0)

    @classmethod
    def open_for(cls, parent: QWidget) -> SettingsDialog:
        """Open the dialog on the user's settings file (it deletes itself when closed) and return it."""
        return _opened(cls(parent=parent))

    def show_settings(self, settings: Settings) -> None:
        for section, editors in self.editors.items():
            values = getattr(settings, section)
            for name, editor in editors.items():
                editor.set(getattr(values, name))

    def restore_defaults(self) -> None:
        self.show_settings(Settings())
        self.error.hide()

    def settings(self) -> Settings:
        """The Settings shown, validated by app.config; InvalidValue names every field that is wrong."""
        raw: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        for section, editors in self.editors.items():
            raw[section] = {}
            for name, editor in editors.items():
                try:
                    raw[section][name] = editor.get()
                except InvalidValue as exc:
                    problems.append(f"{SECTION_TITLES.get(section, section)}: {exc}")
        if not problems:
            try:
                return Settings.model_validate(raw)
            except ValidationError as exc:
                for err in exc.errors():
                    loc = [str(p) for p in err["loc"]]
                    if len(loc) >= 2 and loc[1] in self.editors.get(loc[0], {}):
                        where = f"{SECTION_TITLES.get(loc[0], loc[0])}: {self.editors[loc[0]][loc[1]].label}"
                    else:
                        where = ".".join(loc) or "Settings"
                    problems.append(f"{where}: {err['msg']}.")
        raise InvalidValue("\n".join(problems))

    @property
    def changed_sections(self) -> set[str]:
        return {section for section, _ in self.changed}

    @property
    def restart_needed(self) -> bool:
        return any(self.rows[f].applies == ENGINE_RESTART for f in self.changed)

    @property
    def next_start_needed(self) -> bool:
        return any(self.rows[f].applies == NEXT_START for f in self.changed)

    def sampling_now(self) -> dict[str, Any]:
        """The sampling fields the save changed: every question carries them at once (repeat_last_n is the
        engine's own)."""
        sent = {name for section, name in self.changed if section == "sampling"} - {"repeat_last_n"}
        return {name: getattr(self.saved.sampling, name) for name in sent}

    def waiting_note(self) -> str | None:
        """What the saved settings wait for (an engine restart, the next start), in words; None when
        everything applied."""
        later = []
        if self.restart_needed:
            later.append("restart the engine to use the engine settings")
        if self.next_start_needed:
            later.append("the models folder changes when Foresight starts again")
        return f"Settings saved; {' and '.join(later)}." if later else None

    def accept(self) -> None:
        try:
            new = self.settings()
            save_settings(new, self.file)
        except (InvalidValue, ConfigError) as exc:
            self._show_error(str(exc))
            return
        except OSError as exc:
            self._show_error(f"The settings could not be saved to {self.file}: {exc.strerror or exc}")
            return
        self.changed = {
            (s, n)
            for s, editors in self.editors.items()
            for n in editors
            if getattr(getattr(new, s), n) != getattr(getattr(self.loaded, s), n)
        }
        self.saved = new
        super().accept()

    def _show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()


Dialog = typing.TypeVar("Dialog", bound=QDialog)


def _opened(dialog: Dialog) -> Dialog:
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.open()
    return dialog


def _save_cancel_defaults(
    dialog: QDialog, defaults_tip: str, on_defaults: Any
) -> tuple[QDialogButtonBox, QPushButton, QPushButton]:
    """Save, Cancel and a defaults button wired to the dialog: (the box, Save, the defaults button)."""
    buttons = QDialogButtonBox(
        QDialogButtonBox.StandardButton.Save
        | QDialogButtonBox.StandardButton.Cancel
        | QDialogButtonBox.StandardButton.RestoreDefaults
    )
    defaults = buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults)
    defaults.setToolTip(defaults_tip)
    defaults.clicked.connect(on_defaults)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    return buttons, buttons.button(QDialogButtonBox.StandardButton.Save), defaults
