"""The Devices panel's "Remote devices" offscreen: a real rpc-worker checked through the devices command in
a child, the list saved to the real settings file, the unencrypted-link warning, and the engine's report."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app import paths
from app.config import load_settings
from app.services.remote_devices import save_servers, saved_servers
from app.ui.devices_panel import DevicesPanel
from app.ui.remote_devices import RemoteDevices
from tests.support.rpc_workers import rpc_workers

CHECK_TIMEOUT_MS = 120_000


def test_it_warns_that_the_link_is_open_and_gives_the_tunnel(qtbot: QtBot) -> None:
    widget = RemoteDevices()
    qtbot.addWidget(widget)
    assert "neither encrypted nor authenticated" in widget.warning.text()
    assert "ssh -N -L 50052:127.0.0.1:50052" in widget.warning.text()
    assert "rpc-worker" in widget.warning.text()


def test_a_malformed_address_is_refused_by_name(qtbot: QtBot) -> None:
    widget = RemoteDevices()
    qtbot.addWidget(widget)
    widget.address.setText("gpu-box")
    widget.add()
    assert widget.servers == []
    assert "'gpu-box' is not host:port" in widget.status.text()
    assert not widget.apply_button.isEnabled()


def test_a_worker_is_checked_shown_and_saved_for_the_engine(qtbot: QtBot) -> None:
    with rpc_workers(1) as (worker,):
        widget = RemoteDevices()
        qtbot.addWidget(widget)
        widget.address.setText(worker.address)
        with qtbot.waitSignal(widget.checked, timeout=CHECK_TIMEOUT_MS):
            widget.add()
    assert widget.servers == [worker.address]
    assert widget.table.item(0, 0).text() == worker.address
    assert widget.table.item(0, 1).text() == "ready"
    assert widget.table.item(0, 2).text().endswith("GiB")
    assert widget.table.item(0, 3).text().endswith(" ms")
    assert widget.status.text() == "1 of 1 ready."
    assert widget.apply_button.isEnabled()
    with qtbot.waitSignal(widget.applied, timeout=10_000):
        widget.apply_button.click()
    assert load_settings(paths.config_file(), environ={}).engine.rpc == worker.address
    assert saved_servers() == [worker.address]
    save_servers([])


def test_a_worker_that_is_gone_reads_as_not_answering(qtbot: QtBot) -> None:
    with rpc_workers(1) as (worker,):
        address = worker.address
    widget = RemoteDevices()
    qtbot.addWidget(widget)
    widget.address.setText(address)
    with qtbot.waitSignal(widget.checked, timeout=CHECK_TIMEOUT_MS):
        widget.add()
    assert widget.table.item(0, 1).text() == "not answering"
    assert f"cannot connect to {address}" in widget.table.item(0, 1).toolTip()
    widget.table.selectRow(0)
    with qtbot.waitSignal(widget.checked, timeout=CHECK_TIMEOUT_MS):
        widget.remove()
    assert widget.table.rowCount() == 0


def test_the_engines_report_says_what_it_does_with_the_workers(qtbot: QtBot) -> None:
    widget = RemoteDevices()
    qtbot.addWidget(widget)
    widget.servers = ["127.0.0.1:50052"]
    widget.answers = {"127.0.0.1:50052": {"endpoint": "127.0.0.1:50052", "state": "busy", "devices": []}}
    widget.engine_props({"rpc": {"servers": ["127.0.0.1:50052"], "state": "joined", "reason": ""}})
    assert widget.engine.text() == "The engine uses 127.0.0.1:50052."
    assert widget.table.item(0, 1).text() == "in use by this engine"
    lost = "the RPC worker 127.0.0.1:50052 was lost: the engine process ended (signal SIGABRT)"
    widget.engine_props({"rpc": {"servers": ["127.0.0.1:50052"], "state": "lost", "reason": lost}})
    assert widget.engine.text() == f"The engine runs on this machine alone: {lost}."
    assert widget.table.item(0, 1).text() == "busy: serving an engine"
    widget.engine_props({})
    assert widget.engine.text() == ""


def test_saving_the_list_restarts_the_engine_on_the_device_it_runs_on(qtbot: QtBot, tmp_path: Path) -> None:
    from app.services.client import EngineClient

    panel = DevicesPanel(EngineClient(), device="cpu")
    qtbot.addWidget(panel)
    panel.remote.servers = ["127.0.0.1:50052"]
    with qtbot.waitSignal(panel.deviceChosen, timeout=10_000) as chosen:
        panel.remote.apply()
    assert chosen.args == ["cpu"]
    assert saved_servers() == ["127.0.0.1:50052"]
    save_servers([])
