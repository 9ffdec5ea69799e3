"""One field of app.config as a form row: its bounds, a typed number read back, and its editor widget."""

from __future__ import annotations

import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic.fields import FieldInfo
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox, QWidget

ACRONYMS = {"gpu": "GPU", "hf": "HF", "cors": "CORS", "ctx": "context", "attn": "attention"}
INT32_MAX = 2**31 - 1  # QSpinBox holds a C int; wider fields get a line edit


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
        low = (
            None
            if self.low is None
            else f"{'above' if self.low_open else 'at least'} {shown_number(self.low)}"
        )
        high = (
            None
            if self.high is None
            else f"{'below' if self.high_open else 'at most'} {shown_number(self.high)}"
        )
        if low and high and not (self.low_open or self.high_open):
            return f"from {shown_number(self.low)} to {shown_number(self.high)}"
        return " and ".join(p for p in (low, high) if p) or "any number"


def shown_number(value: float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def plain_type(annotation: Any) -> tuple[Any, bool]:
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


class FieldEditor:
    """The widget of one config field: shows a value and reads it back (raw: app.config validates)."""

    def __init__(self, section: str, name: str, info: FieldInfo) -> None:
        self.section, self.name, self.info = section, name, info
        words = " ".join(ACRONYMS.get(w, w) for w in name.split("_"))
        self.label = words[:1].upper() + words[1:]
        self.bounds = Bounds.of(info)
        kind, optional = plain_type(info.annotation)
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
                w.setText(", ".join(shown_number(v) for v in value))
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
            if self.kind is str:  # an empty text is a value (e.g. no remote devices)
                return ""
            raise InvalidValue(f"{self.label} needs a value.")
        if self.kind in (int, float):
            return parse_number(text, self.kind, self.bounds, self.label)
        if typing.get_origin(self.kind) is list:
            items = [t for t in re.split(r"[,\s]+", text) if t]
            return [parse_number(t, float, Bounds(low=0.0), self.label) for t in items]
        return text
