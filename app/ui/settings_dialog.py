"""The settings dialogs, generated from app.config's typed fields: the app's and one conversation's."""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
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
from app.ui.field_editor import Bounds, FieldEditor, InvalidValue, parse_number, plain_type, shown_number

ERROR_STYLE = "color: #a00000;"

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
        self.error = QLabel(wordWrap=True, styleSheet=ERROR_STYLE)
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


# --- the app settings, one row per field of app.config.Settings ---------------------------------

# Sections the engine process reads when it starts (it loads the same file): changes wait for a restart.
# Sampling is among them: the window sends temperature and max_tokens, the engine supplies the rest.
RESTART_SECTIONS = frozenset({"engine", "draft", "sampling", "server"})
SECTION_TITLES = {
    "engine": "Engine",
    "draft": "Drafting",
    "sampling": "Sampling",
    "server": "Server",
    "models": "Models",
}


class SettingsDialog(QDialog):
    """The app settings, one tab per section of app.config.Settings and one row per field.

    Save validates through app.config and writes the user's settings file with its save_settings.
    Afterwards `saved` holds the new Settings, `changed_sections` the sections that changed and
    `restart_needed` whether the engine has to restart to use them.
    """

    def __init__(self, file: Path | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.file = file if file is not None else paths.config_file()
        self.changed_sections: set[str] = set()
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
        self.editors: dict[str, dict[str, FieldEditor]] = {}
        self.tabs = QTabWidget()
        for section, section_info in Settings.model_fields.items():
            model = section_info.annotation
            assert isinstance(model, type)
            assert issubclass(model, Section)
            page = QWidget()
            form = QFormLayout(page)
            intro = (model.__doc__ or "").strip()
            if section in RESTART_SECTIONS:
                intro += " Changes take effect when the engine restarts."
            if intro.strip():
                form.addRow(QLabel(intro.strip(), wordWrap=True))
            self.editors[section] = {}
            for name, info in model.model_fields.items():
                editor = FieldEditor(section, name, info)
                form.addRow(editor.label, editor.widget)
                self.editors[section][name] = editor
            self.tabs.addTab(page, SECTION_TITLES.get(section, section.capitalize()))
        self.show_settings(self.loaded)

        note = f"Saved to {self.file}."
        overridden = sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and "__" in k)
        if overridden:
            note += " Set in the environment, which wins over the file: " + ", ".join(overridden) + "."
        self.note = QLabel(note, wordWrap=True)
        self.error = QLabel(problem, wordWrap=True, styleSheet=ERROR_STYLE)
        self.error.setVisible(bool(problem))
        buttons, self.save_button, self.defaults_button = _save_cancel_defaults(
            self, "Put every field back to its default (nothing is saved until Save)", self.restore_defaults
        )
        layout = QVBoxLayout(self)
        layout.addWidget(self.note)
        layout.addWidget(self.tabs, 1)
        self.setMinimumWidth(560)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

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
    def restart_needed(self) -> bool:
        return bool(self.changed_sections & RESTART_SECTIONS)

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
        self.changed_sections = {s for s in self.editors if getattr(new, s) != getattr(self.loaded, s)}
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
