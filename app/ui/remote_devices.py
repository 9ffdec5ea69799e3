"""The Devices panel's "Remote devices": the RPC workers (add, remove, their state), what the engine does
with them, and a warning that the link is neither encrypted nor authenticated, with the SSH tunnel."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.addresses import RPC_PORT, parse_endpoint
from app.services.remote_devices import WorkerCheck, save_servers, saved_servers

COLUMNS = ("Worker", "State", "Memory free", "Round trip")
WARNING = (
    "⚠ The link to a worker is neither encrypted nor authenticated: anyone who reaches its port can use "
    "that machine and read the model. Keep each worker on 127.0.0.1 and reach it through an SSH tunnel:"
    f"<br><code>ssh -N -L {RPC_PORT}:127.0.0.1:{RPC_PORT} you@gpu-box</code> on this machine, "
    f"<code>python -m app rpc-worker</code> on the other, then add <code>127.0.0.1:{RPC_PORT}</code> "
    "here (docs/REMOTE.md)."
)
_STATES = {
    "ready": "ready",
    "busy": "busy: serving an engine",
    "unreachable": "not answering",
    "version mismatch": "another version",
    "error": "not a worker",
}


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


class RemoteDevices(QGroupBox):
    """The workers in the settings file, checked in a child process; Apply saves them for the engine."""

    applied = Signal()  # the list was saved: the engine should restart to use it
    checked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Remote devices", parent)
        self.servers: list[str] = saved_servers()
        self.answers: dict[str, dict[str, Any]] = {}
        self.engine_rpc: dict[str, Any] = {}
        self.check = WorkerCheck(self)
        self.check.checked.connect(self._checked)
        self.check.failed.connect(lambda message: self.status.setText(message))

        self.warning = QLabel(WARNING, wordWrap=True, textFormat=Qt.TextFormat.RichText)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.address = QLineEdit(placeholderText=f"host:port, e.g. 127.0.0.1:{RPC_PORT}")
        self.address.returnPressed.connect(self.add)
        self.add_button = QPushButton("Add", clicked=self.add)
        self.remove_button = QPushButton("Remove", clicked=self.remove)
        self.check_button = QPushButton("Check", clicked=self.start_check)
        self.apply_button = QPushButton("Use them (restarts the engine)", clicked=self.apply, enabled=False)
        self.status = QLabel("", wordWrap=True)
        self.engine = QLabel("", wordWrap=True)

        row = QHBoxLayout()
        row.addWidget(self.address, 1)
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.check_button)
        buttons.addWidget(self.apply_button, 1)
        v = QVBoxLayout(self)
        v.addWidget(self.warning)
        v.addWidget(self.table)
        v.addLayout(row)
        v.addLayout(buttons)
        v.addWidget(self.status)
        v.addWidget(self.engine)
        self._show()

    # the list
    def add(self) -> None:
        text = self.address.text().strip()
        try:
            endpoint = str(parse_endpoint(text))
        except ValueError as exc:
            self.status.setText(str(exc))
            return
        if endpoint not in self.servers:
            self.servers.append(endpoint)
        self.address.clear()
        self._edited()

    def remove(self) -> None:
        rows = sorted({i.row() for i in self.table.selectedIndexes()}, reverse=True)
        for row in rows:
            del self.servers[row]
        if rows:
            self._edited()

    def apply(self) -> None:
        try:
            save_servers(self.servers)
        except (ValueError, OSError) as exc:
            self.status.setText(f"not saved: {exc}")
            return
        self.apply_button.setEnabled(False)
        self.status.setText(
            "Saved: the engine restarts with " + (", ".join(self.servers) or "no worker") + "."
        )
        self.applied.emit()

    def _edited(self) -> None:
        self.apply_button.setEnabled(self.servers != saved_servers())
        self._show()
        self.start_check()

    # their state
    def start_check(self) -> None:
        if self.servers:
            self.status.setText("Checking the workers…")
        self.check.start(list(self.servers))

    def _checked(self, answers: list[dict[str, Any]]) -> None:
        self.answers = {a["endpoint"]: a for a in answers}
        ready = sum(a.get("state") == "ready" for a in answers)
        self.status.setText(f"{ready} of {len(answers)} ready." if answers else "No remote worker.")
        self._show()
        self.checked.emit()

    def engine_props(self, props: dict[str, Any]) -> None:
        """What the running engine does with the workers (its /props), or {} when it is not running."""
        self.engine_rpc = props.get("rpc", {})
        rpc = self.engine_rpc
        if not rpc:
            self.engine.setText("")
        elif rpc.get("state") == "lost":
            self.engine.setText(f"The engine runs on this machine alone: {rpc.get('reason', '')}.")
        else:
            self.engine.setText("The engine uses " + ", ".join(rpc.get("servers", [])) + ".")
        self._show()

    def state_of(self, endpoint: str) -> str:
        answer = self.answers.get(endpoint)
        if answer is None:
            return "not checked"
        state = answer.get("state", "")
        used = self.engine_rpc.get("state") == "joined" and endpoint in self.engine_rpc.get("servers", [])
        if state == "busy" and used:
            return "in use by this engine"
        words = _STATES.get(state, state)
        return f"{words} ({answer['version']})" if state == "version mismatch" else words

    def _show(self) -> None:
        self.table.setRowCount(len(self.servers))
        for r, endpoint in enumerate(self.servers):
            answer = self.answers.get(endpoint, {})
            devices = answer.get("devices", [])
            memory = ", ".join(_gib(d["free_bytes"]) for d in devices) if devices else "-"
            trip = f"{answer['latency_ms']:.2f} ms" if answer.get("latency_ms") is not None else "-"
            cells = (endpoint, self.state_of(endpoint), memory, trip)
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c == 1 and answer.get("error"):
                    item.setToolTip(answer["error"])
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
