"""The window's colours: the system's palette, or Fusion's light or a dark one ([appearance] theme), and
the few colours of our own (banners, warnings) taken from whichever palette is in use."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory, QWidget

THEMES = ("system", "light", "dark")
_system: tuple[str, QPalette] | None = None  # the style and palette the app started with


class _Notifier(QObject):
    changed = Signal()  # the theme changed: widgets with colours of their own restyle


_notifier: _Notifier | None = None


def notifier() -> _Notifier:
    """What says the theme changed (a widget with a style sheet misses the palette's own change events)."""
    global _notifier
    if _notifier is None:
        _notifier = _Notifier()
    return _notifier


def _dark_palette() -> QPalette:
    p = QPalette()
    roles = QPalette.ColorRole
    base, window, text = QColor("#1e1f22"), QColor("#2b2d30"), QColor("#dfe1e5")
    for role, colour in (
        (roles.Window, window),
        (roles.WindowText, text),
        (roles.Base, base),
        (roles.AlternateBase, QColor("#26282b")),
        (roles.ToolTipBase, QColor("#3c3f41")),
        (roles.ToolTipText, text),
        (roles.PlaceholderText, QColor("#8c8f94")),
        (roles.Text, text),
        (roles.Button, QColor("#3c3f41")),
        (roles.ButtonText, text),
        (roles.BrightText, QColor("#ff6b68")),
        (roles.Highlight, QColor("#2f65ca")),
        (roles.HighlightedText, QColor("#ffffff")),
        (roles.Link, QColor("#589df6")),
        (roles.LinkVisited, QColor("#9f7de0")),
        (roles.Mid, QColor("#4e5157")),
        (roles.Dark, QColor("#1a1b1e")),
        (roles.Light, QColor("#4e5157")),
    ):
        p.setColor(role, colour)
    disabled = QPalette.ColorGroup.Disabled
    for role in (roles.Text, roles.WindowText, roles.ButtonText):
        p.setColor(disabled, role, QColor("#6f737a"))
    return p


def apply(theme: str, app: QApplication | None = None) -> None:
    """Use `theme` (system, light or dark) for the whole application from now on."""
    global _system
    app = app or QApplication.instance()  # type: ignore[assignment]
    if app is None:
        return
    if _system is None:
        _system = (app.style().name(), QPalette(app.palette()))
    if theme == "system":
        app.setStyle(QStyleFactory.create(_system[0]) or app.style())
        app.setPalette(_system[1])
    else:
        app.setStyle(QStyleFactory.create("Fusion"))
        app.setPalette(_dark_palette() if theme == "dark" else app.style().standardPalette())
    notifier().changed.emit()


def is_dark(widget: QWidget | None = None) -> bool:
    palette = widget.palette() if widget is not None else QGuiApplication.palette()
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


@dataclass(frozen=True)
class Tone:
    """A message's colours: background, text and border."""

    background: str
    text: str
    border: str

    def style(self) -> str:
        return (
            f"background: {self.background}; color: {self.text}; border: 1px solid {self.border}; "
            "border-radius: 4px;"
        )


TONES = {
    # (light, dark) per kind
    "error": (Tone("#fde8e8", "#7a1010", "#f3b8b8"), Tone("#4a1f22", "#ffd7d5", "#7d3338")),
    "warning": (Tone("#fff4d6", "#5c4300", "#f0d58a"), Tone("#45391a", "#ffe9a8", "#7a6428")),
    "info": (Tone("#e6f0fd", "#0d3a75", "#b7cff2"), Tone("#1f3147", "#d3e5ff", "#3b5a80")),
}


def tone(kind: str, widget: QWidget | None = None) -> Tone:
    """The colours of a message of this kind (error, warning, info) on the palette in use."""
    light, dark = TONES[kind]
    return dark if is_dark(widget) else light


def error_text(widget: QWidget | None = None) -> str:
    """A style sheet for error text that reads on the palette in use."""
    return f"color: {'#ff8a80' if is_dark(widget) else '#a00000'};"
