"""The "Devices" panel: what was found, what the target and the drafter run on and why, and a manual
choice of device (the engine restarts on it)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.services.client import EngineClient
from app.services.devices import DeviceScan
from app.ui.panel import scrolled
from app.ui.remote_devices import RemoteDevices

COLUMNS = ("Device", "Kind", "Memory", "Free", "Runs with", "Seen by")
COLUMN_WIDTH = 160


def _gib(n: Any) -> str:
    return f"{int(n) / 2**30:.1f} GiB" if n else "-"


class DevicesPanel(QDockWidget):
    deviceChosen = Signal(str)  # auto, cpu, gpu or gpu:N: the engine should restart on it
    scanned = Signal()

    def __init__(self, client: EngineClient, device: str = "auto", parent: QWidget | None = None) -> None:
        super().__init__("Devices", parent)
        self.setObjectName("devices")
        self.client = client
        self.scan = DeviceScan(self)
        self.scan.scanned.connect(self._scanned)
        self.scan.failed.connect(lambda message: self.found.setText(message))
        self.devices: list[dict] = []
        self.props: dict[str, Any] = {}

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.found = QLabel("Looking for devices…", wordWrap=True)
        self.target = QLabel("Target: the engine is not running.", wordWrap=True)
        self.drafter = QLabel("", wordWrap=True)
        self.choice = QComboBox()
        self.choice.addItem("Automatic", "auto")
        self.choice.addItem("CPU only", "cpu")
        self.apply = QPushButton("Use it (restarts the engine)")
        self.apply.clicked.connect(lambda: self.deviceChosen.emit(str(self.choice.currentData())))
        self.rescan = QPushButton("Look again")
        self.rescan.clicked.connect(lambda: self.start_scan())
        self.remote = RemoteDevices()  # a saved list of workers restarts the engine on the same device
        self.remote.applied.connect(lambda: self.deviceChosen.emit(self._current))
        self._current = device

        row = QHBoxLayout()
        row.addWidget(QLabel("Run on"))
        row.addWidget(self.choice, 1)
        row.addWidget(self.apply)
        body = QWidget()
        v = QVBoxLayout(body)
        v.addWidget(self.found)
        v.addWidget(self.table, 1)
        v.addWidget(self.target)
        v.addWidget(self.drafter)
        v.addLayout(row)
        v.addWidget(self.rescan)
        v.addWidget(self.remote)
        self.setWidget(scrolled(body))

    def start_scan(self, target: str | None = None) -> None:
        self.found.setText("Looking for devices…")
        self.scan.start(target)
        self.remote.start_check()

    def engine_ready(self) -> None:
        reply = self.client.get_json("/props")
        reply.done.connect(self._props)

    def engine_stopped(self) -> None:
        self.props = {}
        self.remote.engine_props({})
        self.target.setText("Target: the engine is not running.")
        self.drafter.setText("")

    def _scanned(self, data: dict) -> None:
        self.devices = data["devices"]
        self.table.setRowCount(len(self.devices))
        for r, d in enumerate(self.devices):
            cells = (
                d.get("name", "?") + (f" ({d['cores']} cores)" if d.get("cores") else ""),
                d.get("kind", ""),
                _gib(d.get("total_bytes")),
                _gib(d.get("free_bytes")),
                ", ".join(d.get("backends", [])),
                d.get("source", ""),
            )
            for c, text in enumerate(cells):
                self.table.setItem(r, c, QTableWidgetItem(str(text)))
        self.table.resizeColumnsToContents()
        for column in range(self.table.columnCount()):  # long names elide; the user can widen them
            self.table.setColumnWidth(column, min(self.table.columnWidth(column), COLUMN_WIDTH))
        gpus = [d for d in self.devices if d.get("kind") != "cpu"]
        placement = data.get("placement", {})
        text = f"{len(gpus)} GPU(s) found." if gpus else "No GPU found: everything runs on the CPU."
        if placement.get("reason"):
            text += f" Automatic placement: {placement['reason']}."
        if not gpus and data.get("notes"):
            text += " (" + "; ".join(data["notes"][:3]) + ")"
        self.found.setText(text)
        while self.choice.count() > 2:
            self.choice.removeItem(2)
        if gpus:
            self.choice.addItem("GPU (all layers, spread over all GPUs)", "gpu")
            for d in gpus:
                self.choice.addItem(
                    f"GPU {d.get('index', 0)}: {d.get('name', '?')}", f"gpu:{d.get('index', 0)}"
                )
        index = self.choice.findData(self._current)
        self.choice.setCurrentIndex(max(index, 0))
        self.scanned.emit()

    def _props(self, props: dict) -> None:
        self.props = props
        self.remote.engine_props(props)
        t = props.get("target", {})
        layers = (
            f", {t['gpu_layers']} of {t['n_layer']} layers on the GPU" if t.get("device") == "gpu" else ""
        )
        self.target.setText(
            f"Target {t.get('name', '?')}: {t.get('device', '?')}{layers} — {t.get('device_reason', '')}"
        )
        d = props.get("draft", {})
        if d.get("source") == "ngram":
            self.drafter.setText("Drafts: n-gram lookup in the conversation (no drafter model, no memory).")
        elif d.get("name"):
            self.drafter.setText(f"Drafter {d['name']}: {d.get('device', '?')}")
        else:
            self.drafter.setText("Drafts: none (plain decoding).")

    def set_current(self, device: str) -> None:
        self._current = device
        index = self.choice.findData(device)
        if index >= 0:
            self.choice.setCurrentIndex(index)
