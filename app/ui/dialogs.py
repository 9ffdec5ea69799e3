"""The app's dialogs: a conversation's settings, the app settings generated from app.config, and the
File menu's data actions (export, import, delete all)."""

from __future__ import annotations

import json
import math
import os
import re
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import paths
from app.chats.store import ChatStore, ChatStoreError
from app.config import (
    ENV_PREFIX,
    ConfigError,
    SamplingSettings,
    Section,
    Settings,
    load_settings,
    save_settings,
)

ACRONYMS = {"gpu": "GPU", "hf": "HF", "cors": "CORS", "ctx": "context", "attn": "attention"}
INT32_MAX = 2**31 - 1  # QSpinBox holds a C int; wider fields get a line edit
ERROR_STYLE = "color: #a00000;"

# --- bounds and numbers, read from the config's fields ------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """A field's numeric range as app.config declares it (ge/gt/le/lt)."""

    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False

    @classmethod
    def of(cls, info: FieldInfo) -> Bounds:
        low = high = None
        low_open = high_open = False
        for m in info.metadata:
            if getattr(m, "ge", None) is not None:
                low = m.ge
            if getattr(m, "gt", None) is not None:
                low, low_open = m.gt, True
            if getattr(m, "le", None) is not None:
                high = m.le
            if getattr(m, "lt", None) is not None:
                high, high_open = m.lt, True
        return cls(low, low_open, high, high_open)

    def contains(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        low = None if self.low is None else f"{'above' if self.low_open else 'at least'} {_num(self.low)}"
        high = None if self.high is None else f"{'below' if self.high_open else 'at most'} {_num(self.high)}"
        if low and high and not (self.low_open or self.high_open):
            return f"from {_num(self.low)} to {_num(self.high)}"
        return " and ".join(p for p in (low, high) if p) or "any number"


def _num(value: float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _plain(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed): `int | None` -> (int, True)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


class InvalidValue(ValueError):
    """A value typed into a dialog that its field does not accept; the message is for the user."""


def parse_number(text: str, kind: type, bounds: Bounds, label: str) -> int | float:
    """The number in `text` as `kind` (int or float) within `bounds`, or InvalidValue saying why not."""
    text = text.strip()
    try:
        value: int | float = int(text) if kind is int else float(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InvalidValue(f"{label} must be {what}, not “{text}”.") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValue(f"{label} must be a finite number, not “{text}”.")
    if not bounds.contains(value):
        raise InvalidValue(f"{label} must be {bounds.describe()}; “{text}” is out of range.")
    return value


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
        defaults: Mapping[str, Any] | None = None,
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
            default = (defaults or {}).get(name, info.default)
            value = conv.settings.get(name)
            edit = QLineEdit("" if value is None else str(value))
            edit.setClearButtonEnabled(True)
            edit.setPlaceholderText(f"app default ({'unset' if default is None else _num(default)})")
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
            kind, _ = _plain(info.annotation)
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


class FieldEditor:
    """The widget of one config field: shows a value and reads it back (raw: app.config validates)."""

    def __init__(self, section: str, name: str, info: FieldInfo) -> None:
        self.section, self.name, self.info = section, name, info
        words = " ".join(ACRONYMS.get(w, w) for w in name.split("_"))
        self.label = words[:1].upper() + words[1:]
        self.bounds = Bounds.of(info)
        kind, optional = _plain(info.annotation)
        self.kind, self.optional = kind, optional
        self.widget: QWidget
        low = self.bounds.low if self.bounds.low is not None else -INT32_MAX
        high = self.bounds.high if self.bounds.high is not None else INT32_MAX
        if kind is bool:
            self.widget = QCheckBox()
        elif typing.get_origin(kind) is Literal:
            combo = QComboBox()
            combo.addItems([str(c) for c in typing.get_args(kind)])
            self.widget = combo
        elif kind is int and not optional and low >= -INT32_MAX and high <= INT32_MAX:
            spin = QSpinBox()
            spin.setRange(int(low) + self.bounds.low_open, int(high) - self.bounds.high_open)
            spin.setGroupSeparatorShown(high >= 10_000)
            self.widget = spin
        elif kind is float and not optional:
            dspin = QDoubleSpinBox(decimals=4)
            step = 10.0 ** -dspin.decimals()
            dspin.setRange(low + step * self.bounds.low_open, high - step * self.bounds.high_open)
            dspin.setSingleStep(0.05 if high - low <= 10 else 1.0)
            self.widget = dspin
        else:  # str, optional values, ints wider than a spin box, lists
            edit = QLineEdit()
            if optional:
                edit.setPlaceholderText("unset")
            self.widget = edit
        help_text = info.description or ""
        where = f"[{section}] {name} in the settings file"
        self.widget.setToolTip(f"{help_text}\n{where}" if help_text else where)

    def set(self, value: Any) -> None:
        w = self.widget
        if isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QComboBox):
            w.setCurrentText(str(value))
        elif isinstance(w, QSpinBox | QDoubleSpinBox):
            w.setValue(value)
        elif isinstance(w, QLineEdit):
            if value is None:
                w.setText("")
            elif isinstance(value, list):
                w.setText(", ".join(_num(v) for v in value))
            else:
                w.setText(str(value))

    def get(self) -> Any:
        w = self.widget
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return w.currentText()
        if isinstance(w, QDoubleSpinBox):
            return round(w.value(), w.decimals())
        if isinstance(w, QSpinBox):
            return w.value()
        assert isinstance(w, QLineEdit)
        text = w.text().strip()
        if not text:
            if self.optional:
                return None
            raise InvalidValue(f"{self.label} needs a value.")
        if self.kind in (int, float):
            return parse_number(text, self.kind, self.bounds, self.label)
        if typing.get_origin(self.kind) is list:
            items = [t for t in re.split(r"[,\s]+", text) if t]
            return [parse_number(t, float, Bounds(low=0.0), self.label) for t in items]
        return text


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


# --- data: export, import, delete all -----------------------------------------------------------


def export_all_json(store: ChatStore, path: Path) -> int:
    """Every conversation to a JSON file (ChatStore's export format); returns how many."""
    data = store.export_json()
    paths.write_atomic(path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    return len(data["conversations"])


def export_markdown(store: ChatStore, conversation_id: int, path: Path) -> None:
    paths.write_atomic(path, store.export_markdown(conversation_id))


class ImportFailed(ValueError):
    """An import file that cannot be read or is not a Foresight export; nothing was imported."""


def import_json_file(store: ChatStore, path: Path) -> int:
    """Add the conversations of an export file, all or none; returns how many were added."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ImportFailed(f"{path.name} could not be read: {exc.strerror or exc}.") from exc
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{path.name} is not a text file (JSON is UTF-8 text).") from exc
    except json.JSONDecodeError as exc:
        raise ImportFailed(
            f"{path.name} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from exc
    _check_shape(data, path.name)
    try:
        return store.import_json(data)  # one transaction: a malformed conversation adds none of them
    except ChatStoreError as exc:
        raise ImportFailed(f"{path.name} could not be imported: {exc}.") from exc


def _check_shape(data: Any, name: str) -> None:
    """What ChatStore.import_json would store without complaint but the app cannot use later."""
    convs = data.get("conversations") if isinstance(data, dict) else None
    if not isinstance(convs, list):
        return  # the store says what is wrong with the top level
    for n, c in enumerate(convs, 1):
        if not isinstance(c, dict):
            raise ImportFailed(f"{name}: conversation {n} is not an object.")
        if not isinstance(c.get("settings") or {}, dict):
            raise ImportFailed(f"{name}: the settings of conversation {n} are not an object.")
        messages = c.get("messages", [])
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ImportFailed(f"{name}: the messages of conversation {n} are not a list of objects.")


def data_summary(store: ChatStore) -> tuple[int, int]:
    """(conversations, messages) in the store."""
    convs = store.conversations()
    return len(convs), sum(len(store.messages(c.id)) for c in convs)


def damaged_copies(store: ChatStore) -> list[Path]:
    """Chat files the store set aside as unreadable: they hold old conversations too."""
    return sorted(store.path.parent.glob(f"{store.path.stem}.damaged-*"))


def delete_all_data(store: ChatStore) -> list[Path]:
    """Every conversation and message, and the set-aside damaged copies; returns the copies removed."""
    store.delete_all()
    removed = damaged_copies(store)
    for p in removed:
        p.unlink(missing_ok=True)
    return removed


def _file_name(title: str, suffix: str) -> str:
    stem = re.sub(r"[^\w\- ]+", "", title).strip()[:60] or "conversation"
    return stem + suffix


class Prompts:
    """The file dialogs and message boxes of DataActions (tests subclass it with scripted answers)."""

    def save_path(self, parent: QWidget | None, title: str, suggested: Path, file_filter: str) -> Path | None:
        path, _ = QFileDialog.getSaveFileName(parent, title, str(suggested), file_filter)
        return Path(path) if path else None

    def open_path(self, parent: QWidget | None, title: str, file_filter: str) -> Path | None:
        path, _ = QFileDialog.getOpenFileName(parent, title, str(Path.home()), file_filter)
        return Path(path) if path else None

    def confirm(self, parent: QWidget | None, title: str, text: str, action: str) -> bool:
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent)
        go = box.addButton(action, QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(box.addButton(QMessageBox.StandardButton.Cancel))
        box.exec()
        return box.clickedButton() is go

    def inform(self, parent: QWidget | None, title: str, text: str) -> None:
        QMessageBox.information(parent, title, text)

    def warn(self, parent: QWidget | None, title: str, text: str) -> None:
        QMessageBox.warning(parent, title, text)


class DataActions(QObject):
    """The File menu's export, import and delete-all, with their dialogs.

    `current` gives the conversation shown (for the Markdown export). `storeChanged` fires after an
    import or a delete-all: the window refreshes its list (and forgets its current conversation after
    a delete-all, which `deletedAll` signals).
    """

    storeChanged = Signal()
    deletedAll = Signal()

    def __init__(
        self,
        store: ChatStore,
        parent: QWidget,
        current: Callable[[], int | None] = lambda: None,
        prompts: Prompts | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.window = parent
        self.current = current
        self.prompts = prompts or Prompts()
        self.export_all_action = QAction("&Export all conversations (JSON)…", parent)
        self.export_all_action.triggered.connect(self.export_all)
        self.export_markdown_action = QAction("Export this conversation (&Markdown)…", parent)
        self.export_markdown_action.triggered.connect(self.export_current)
        self.import_action = QAction("&Import conversations (JSON)…", parent)
        self.import_action.triggered.connect(self.import_file)
        self.delete_all_action = QAction("&Delete all my data…", parent)
        self.delete_all_action.triggered.connect(self.delete_all)

    def add_to_menu(self, menu: QMenu) -> None:
        menu.addAction(self.export_all_action)
        menu.addAction(self.export_markdown_action)
        menu.addAction(self.import_action)
        menu.addSeparator()
        menu.addAction(self.delete_all_action)
        menu.aboutToShow.connect(lambda: self.export_markdown_action.setEnabled(self.current() is not None))

    def export_all(self) -> Path | None:
        if not self.store.conversations():
            self.prompts.inform(self.window, "Export", "There are no conversations to export.")
            return None
        suggested = Path.home() / time.strftime("foresight-chats-%Y-%m-%d.json")
        path = self.prompts.save_path(self.window, "Export all conversations", suggested, "JSON (*.json)")
        if path is None:
            return None
        try:
            count = export_all_json(self.store, path)
        except OSError as exc:
            self.prompts.warn(self.window, "Export", f"{path} could not be written: {exc.strerror or exc}")
            return None
        self.prompts.inform(self.window, "Export", f"{count} conversation(s) exported to {path}.")
        return path

    def export_current(self) -> Path | None:
        conversation_id = self.current()
        if conversation_id is None:
            self.prompts.inform(self.window, "Export", "Choose a conversation to export first.")
            return None
        title = self.store.conversation(conversation_id).title
        suggested = Path.home() / _file_name(title, ".md")
        path = self.prompts.save_path(self.window, "Export this conversation", suggested, "Markdown (*.md)")
        if path is None:
            return None
        try:
            export_markdown(self.store, conversation_id, path)
        except OSError as exc:
            self.prompts.warn(self.window, "Export", f"{path} could not be written: {exc.strerror or exc}")
            return None
        return path

    def import_file(self) -> int:
        """Returns how many conversations were added (0: cancelled or refused)."""
        path = self.prompts.open_path(self.window, "Import conversations", "JSON (*.json);;All files (*)")
        if path is None:
            return 0
        try:
            count = import_json_file(self.store, path)
        except ImportFailed as exc:
            self.prompts.warn(self.window, "Import", f"{exc}\n\nNothing was imported.")
            return 0
        self.storeChanged.emit()
        self.prompts.inform(self.window, "Import", f"{count} conversation(s) imported from {path.name}.")
        return count

    def delete_all(self) -> bool:
        conversations, messages = data_summary(self.store)
        copies = damaged_copies(self.store)
        text = (
            f"Delete all {conversations} conversation(s) and their {messages} message(s), "
            f"system prompts and settings from {self.store.path}?"
        )
        if copies:
            text += f"\n\nAlso deleted: {len(copies)} damaged chat file(s) set aside earlier: " + ", ".join(
                p.name for p in copies
            )
        text += (
            "\n\nThis cannot be undone; export first to keep a copy. Your app settings, models and "
            "Hugging Face token are not touched."
        )
        if not self.prompts.confirm(self.window, "Delete all my data", text, "Delete everything"):
            return False
        delete_all_data(self.store)
        self.deletedAll.emit()
        self.storeChanged.emit()
        return True


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
