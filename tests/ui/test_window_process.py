"""The window and its engine as processes: a killed window takes its engine along, a window that starts
finds the engine an earlier one left behind and ends it, and a port another program holds is named (the
real window, offscreen, with real engines on gemma-3-270m)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app import lockfile, processes
from app.chats.store import ChatStore
from app.config import SamplingSettings
from app.services.engine import READY, EngineLaunch
from app.ui.main_window import MainWindow
from app.ui.session import ApiSwitch, WindowSession
from tests.support.server_helpers import ROOT, free_port

START_MS = 300_000  # generous: a model loads, calibrates and answers slowly on a busy 2-core machine
GONE_S = 10.0  # a window's engine ends within this long of the window (polled)
TOKEN = "leftover-token-0123456789"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not processes.alive(pid):
            return True
        time.sleep(0.1)
    return not processes.alive(pid)


def _window(qtbot: QtBot, store: ChatStore, gemma_path: Path, session: WindowSession) -> MainWindow:
    window = MainWindow(
        store,
        EngineLaunch(str(gemma_path), draft={"mode": "ngram"}, engine={"n_ctx": 1024}),
        sampling=SamplingSettings(temperature=0.0, max_tokens=8),
        session=session,
    )
    qtbot.addWidget(window)
    window.show()
    return window


def test_a_window_killed_while_an_answer_streams_takes_its_engine_and_ports_along(
    gemma_path: Path, tmp_path: Path
) -> None:
    window = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "ui" / "window_process.py"), str(gemma_path), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    try:
        assert window.stdout is not None
        line = window.stdout.readline()
        assert line, "the window printed nothing: it did not get to stream an answer"
        started = json.loads(line)
        engine, ports = started["engine"], (started["port"], started["public"])
        assert processes.alive(engine)
        assert all(processes.port_holder(p) is not None for p in ports)
        window.send_signal(signal.SIGKILL)  # no closeEvent, no stop(): only the engine's own watch
        window.wait(30)
        assert _gone_within(engine, GONE_S), "the engine outlived its killed window"
        assert all(processes.port_holder(p) is None for p in ports), "a port is still held"
        assert not lockfile.path_of(engine).exists()
    finally:
        if window.poll() is None:
            window.kill()
            window.wait(30)


def _leave_an_engine_behind(gemma_path: Path, public_port: int, log: Path) -> int:
    """An earlier window (a process that exits here) whose engine stays, serving `public_port`: started
    without the window's pid, as an engine of an older Foresight was. Returns the engine's pid."""
    earlier_window = textwrap.dedent(
        f"""
        import subprocess, sys, time, httpx
        log = open({str(log)!r}, "w")
        engine = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--target", {str(gemma_path)!r}, "--ngram",
             "--n-ctx", "1024", "--port", "0", "--token-stdin"],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True)
        engine.stdin.write({TOKEN!r} + "\\n"); engine.stdin.close()
        deadline = time.monotonic() + 120
        while "READY port=" not in open({str(log)!r}).read() and time.monotonic() < deadline:
            time.sleep(0.2)
        port = int(open({str(log)!r}).read().split("READY port=")[1].split()[0])
        httpx.post(f"http://127.0.0.1:{{port}}/admin/public", json={{"port": {public_port}}},
                   headers={{"Authorization": "Bearer {TOKEN}"}}, timeout=60).raise_for_status()
        print(engine.pid, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", earlier_window], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr + log.read_text()
    return int(done.stdout.strip())


def test_a_leftover_engine_holding_the_port_is_ended_and_the_switch_comes_back_on_it(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    port = free_port()
    leftover = _leave_an_engine_behind(gemma_path, port, tmp_path / "leftover.log")
    try:
        record = dict(lockfile.records())[lockfile.path_of(leftover)]
        assert record.running
        assert record.orphaned  # its window is gone
        holder = processes.port_holder(port)
        assert holder is not None
        assert holder.pid == leftover
        session = WindowSession(tmp_path / "window.ini")
        session.api = ApiSwitch(on=True, port=port)  # the switch was left on, on that port
        window = _window(qtbot, store, gemma_path, session)
        messages: list[str] = []
        window.statusBar().messageChanged.connect(messages.append)
        with qtbot.waitSignal(window.api_panel.changed, timeout=START_MS) as changed:
            window.start_engine()
        assert changed.args[0]["open"], window.api_panel.status.text()
        assert changed.args[0]["port"] == port
        assert not processes.alive(leftover)
        assert any("left running by an earlier window" in m and str(leftover) in m for m in messages)
        assert not lockfile.path_of(leftover).exists()
        assert processes.port_holder(port).pid == window.engine.pid  # type: ignore[union-attr]
        window.close()
    finally:
        if processes.alive(leftover):
            os.kill(leftover, signal.SIGKILL)


def test_a_port_held_by_another_program_is_named(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        session = WindowSession(tmp_path / "window.ini")
        session.api = ApiSwitch(on=True, port=port)
        window = _window(qtbot, store, gemma_path, session)
        with qtbot.waitSignal(window.api_panel.changed, timeout=START_MS) as changed:
            window.start_engine()
        assert window.engine.state == READY
        assert not changed.args[0]["open"]
        status = window.api_panel.status.text()
        assert f"port {port} is in use by" in status
        assert f"(pid {os.getpid()})" in status  # this test's process holds it
        assert "Errno" not in status
        window.close()
