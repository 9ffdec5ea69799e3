"""The "Local API server" panel: switch the engine's OpenAI-compatible listener on and off, and copy the
settings an editor needs. The engine opens and closes the listener itself (admin routes), so no restart
is needed; the panel keeps the switch on across an engine restart by opening the listener again. The key
is shown only when asked (Show); the settings to copy carry it either way.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDockWidget,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.services.api_server import LAN_HOST, LOOPBACK, ApiKeys, Endpoint, lan_addresses
from app.services.client import EngineClient
from app.services.leftover import port_taken_by
from app.ui.panel import scrolled
from app.ui.session import ApiSwitch


class ApiServerPanel(QDockWidget):
    changed = Signal(dict)  # the listener's state after each change: {"open": bool, "url": ..., ...}

    def __init__(self, client: EngineClient, keys: ApiKeys, port: int = 8080, parent: QWidget | None = None):
        super().__init__("Local API server", parent)
        self.setObjectName("api-server")
        self.client = client
        self.keys = keys
        self.wanted = False  # the user's switch; the listener follows it when the engine is up
        self.info: dict[str, Any] = {"open": False}
        self.model = "model"
        self.context = 4096
        self._engine_up = False

        self.toggle = QPushButton("Start the API server", checkable=True)
        self.toggle.clicked.connect(self._toggled)
        self.port = QSpinBox(minimum=0, maximum=65535, value=port)
        self.port.setSpecialValueText("any free port")
        self.lan = QCheckBox("Allow other devices on my network (they need the API key)")
        self.lan.toggled.connect(self._update)
        self.status = QLabel("The API server is off.", wordWrap=True)
        self.address = QLineEdit(readOnly=True, placeholderText="not serving")
        self.address.setToolTip("The base URL clients use (OpenAI-compatible, …/v1)")
        self.key = QLineEdit(readOnly=True)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_note = QLabel(wordWrap=True)
        self.show_key = QPushButton("Show", checkable=True)
        self.show_key.setToolTip("Show the key here and in the settings below")
        self.show_key.toggled.connect(self._show_key)
        self.client_choice = QComboBox()
        self.client_choice.currentTextChanged.connect(self._show_config)
        self.config = QPlainTextEdit(readOnly=True)
        self.copy = QPushButton("Copy")
        self.copy.setToolTip("Copy these settings, with the key, to the clipboard")
        self.copy.clicked.connect(self._copy)

        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.addRow("Address", self.address)
        form.addRow("Port", self.port)
        form.addRow("", self.lan)
        key_row = QHBoxLayout()
        key_row.addWidget(self.key, 1)
        key_row.addWidget(self.show_key)
        form.addRow("API key", key_row)
        form.addRow("", self.key_note)
        pick = QHBoxLayout()
        pick.addWidget(QLabel("Settings for"))
        pick.addWidget(self.client_choice, 1)
        pick.addWidget(self.copy)
        body = QWidget()
        v = QVBoxLayout(body)
        v.addWidget(self.toggle)
        v.addWidget(self.status)
        v.addLayout(form)
        v.addLayout(pick)
        v.addWidget(self.config, 1)
        self.setWidget(scrolled(body))
        self._configs: dict[str, str] = {}
        self._masked: dict[str, str] = {}
        self._update()

    # --- engine ----------------------------------------------------------------------------

    def engine_ready(self) -> None:
        """The engine (re)started: learn its model, and reopen the listener if the switch is on."""
        self._engine_up = True
        self.info = {"open": False}  # a new engine process has no listener yet
        models = self.client.get_json("/v1/models")
        models.done.connect(self._models)
        if self.wanted:
            self._open()
        self._update()

    def engine_stopped(self) -> None:
        self._engine_up = False
        self.info = {"open": False}
        self._update()

    def _models(self, data: dict) -> None:
        cards = data.get("data") or [{}]
        self.model = str(cards[0].get("id", self.model))
        self.context = int(cards[0].get("context_length", self.context))
        self._update()

    # --- switch ----------------------------------------------------------------------------

    def _toggled(self, on: bool) -> None:
        self.wanted = on
        if not self._engine_up:
            self._update()
            return
        if on:
            self._open()
        else:
            reply = self.client.delete("/admin/public")
            reply.done.connect(self._state)
            reply.failed.connect(self._failed)

    def _open(self) -> None:
        host = LAN_HOST if self.lan.isChecked() else LOOPBACK
        body: dict[str, Any] = {"host": host, "port": self.port.value()}
        if self.lan.isChecked():
            body["api_key"] = self.keys.key()[0]
        self.status.setText("Starting the API server…")
        reply = self.client.post_json("/admin/public", body)
        reply.done.connect(self._state)
        reply.failed.connect(self._failed)

    def _state(self, info: dict) -> None:
        self.info = info
        self._update()
        self.changed.emit(info)

    def _failed(self, message: str) -> None:
        self.wanted = False
        self.info = {"open": False}
        self._update()
        port = self.port.value()
        holder = port_taken_by(port) if port else None
        if holder is not None:
            message = f"port {port} is in use by {holder}. Stop that program, or choose another port"
        self.status.setText(f"The API server could not start: {message}.")
        self.changed.emit(self.info)

    def set_switch(self, switch: ApiSwitch) -> None:
        """Put the switch as it was left (a relaunch): the listener opens once the engine is ready."""
        self.port.setValue(switch.port)
        self.lan.setChecked(switch.lan)
        if switch.on != self.wanted:
            self._toggled(switch.on)
        self._update()

    def switch(self) -> ApiSwitch:
        return ApiSwitch(self.wanted, self.port.value(), self.lan.isChecked())

    # --- view ------------------------------------------------------------------------------

    def endpoint(self) -> Endpoint | None:
        if not self.info.get("open"):
            return None
        key = self.keys.key()[0] if self.info.get("auth") else None
        return Endpoint(str(self.info["url"]), self.model, self.context, key)

    def _update(self) -> None:
        on = bool(self.info.get("open"))
        self.toggle.blockSignals(True)
        self.toggle.setChecked(self.wanted)
        self.toggle.blockSignals(False)
        self.toggle.setText("Stop the API server" if self.wanted else "Start the API server")
        self.port.setEnabled(not on)
        self.lan.setEnabled(not on)
        locked = "Stop the API server to change this." if on else ""
        self.port.setToolTip(locked or "The port clients connect to (any free port: the OS picks one)")
        self.lan.setToolTip(locked or "Other computers and phones on your network may use it, with the key")
        if on:
            self.address.setText(str(self.info["url"]))
            where = ""
            if self.info.get("host") == LAN_HOST:
                others = ", ".join(f"http://{a}:{self.info['port']}/v1" for a in lan_addresses())
                where = f" Other devices use {others}." if others else " Other devices on the network too."
            self.status.setText(f"Serving {self.model}.{where}")
        else:
            self.address.setText("")
            if self.wanted and not self._engine_up:
                self.status.setText("The API server starts when the engine is ready.")
            elif not self.wanted:
                self.status.setText("The API server is off.")
        needs_key = self.lan.isChecked() or bool(self.info.get("auth"))
        if needs_key:
            key, where_kept = self.keys.key()
            self.key.setText(key)
            self.key_note.setText(where_kept)
            self.key_note.setToolTip(f"The keyring said: {self.keys.why_not}" if self.keys.why_not else "")
        else:
            self.key.setText("")
            self.key_note.setText("Only this computer can reach it, so no key is needed.")
            self.key_note.setToolTip("")
        self.key.setEnabled(needs_key)
        self.show_key.setEnabled(needs_key)
        self.key.setToolTip("" if needs_key else "A key is needed only when other devices may connect")
        planned_key = self.keys.key()[0] if needs_key else None  # what clients will need once it is on
        endpoint = self.endpoint() or Endpoint(
            f"http://127.0.0.1:{self.port.value() or 8080}/v1", self.model, self.context, planned_key
        )
        configs = endpoint.clients()
        self._masked = endpoint.masked().clients()
        chosen = self.client_choice.currentText()
        self.client_choice.blockSignals(True)
        if self.client_choice.count() != len(configs):
            self.client_choice.clear()
            self.client_choice.addItems(list(configs))
        if chosen in configs:
            self.client_choice.setCurrentText(chosen)
        self.client_choice.blockSignals(False)
        self._configs = configs
        self._show_config(self.client_choice.currentText())

    def _show_config(self, name: str) -> None:
        shown = self._configs if self.show_key.isChecked() else self._masked
        self.config.setPlainText(shown.get(name, ""))

    def _show_key(self, on: bool) -> None:
        self.key.setEchoMode(QLineEdit.EchoMode.Normal if on else QLineEdit.EchoMode.Password)
        self._show_config(self.client_choice.currentText())

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self._configs.get(self.client_choice.currentText(), ""))
