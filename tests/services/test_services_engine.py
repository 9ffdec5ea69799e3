"""The GUI's engine supervisor against a real engine subprocess (gemma-3-270m, CPU)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
from pytestqt.qtbot import QtBot

from app.services.engine import CRASHED, READY, STOPPED, EngineProcess

START_TIMEOUT_MS = 120_000


@pytest.fixture
def engine(qtbot: QtBot, gemma_path: Path):
    proc = EngineProcess()
    yield proc
    proc.stop()


def _start(qtbot: QtBot, engine: EngineProcess, gemma_path: Path) -> int:
    with qtbot.waitSignal(engine.ready, timeout=START_TIMEOUT_MS) as ready:
        engine.start(["--target", str(gemma_path), "--ngram", "--n-ctx", "1024"])
    return ready.args[0]


def test_start_ready_answer_and_stop(qtbot: QtBot, engine: EngineProcess, gemma_path: Path) -> None:
    port = _start(qtbot, engine, gemma_path)
    assert engine.state == READY
    assert port == engine.port
    assert httpx.get(f"{engine.url}/health").status_code == 200
    # the per-launch token reached the engine over stdin: the admin routes answer to it alone
    admin = f"{engine.url}/admin/public"
    assert httpx.get(admin).status_code == 401
    assert httpx.get(admin, headers={"Authorization": f"Bearer {engine.token}"}).status_code == 200
    chat = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}
    assert httpx.post(f"{engine.url}/v1/chat/completions", json=chat, timeout=60).status_code == 401
    answer = httpx.post(
        f"{engine.url}/v1/chat/completions",
        json=chat,
        headers={"Authorization": f"Bearer {engine.token}"},  # the GUI's private port wants its token
        timeout=60,
    )
    assert answer.status_code == 200
    assert any(line.startswith("READY port=") for line in engine.log)
    with qtbot.waitSignal(engine.stateChanged, timeout=10_000, check_params_cb=lambda s: s == STOPPED):
        engine.stop()
    assert engine.exit_code == 0  # SIGTERM: a clean stop


def test_a_killed_engine_is_reported_with_its_last_lines_and_restarts(
    qtbot: QtBot, engine: EngineProcess, gemma_path: Path
) -> None:
    _start(qtbot, engine, gemma_path)
    with qtbot.waitSignal(engine.crashed, timeout=10_000) as crash:
        os.kill(engine.pid, signal.SIGKILL)
    code, tail = crash.args
    assert code == -1
    assert engine.state == CRASHED
    assert "READY port=" in tail
    with qtbot.waitSignal(engine.ready, timeout=START_TIMEOUT_MS) as ready:
        engine.restart()
    port = ready.args[0]
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200


def test_an_engine_that_fails_to_load_is_a_crash_with_the_reason(
    qtbot: QtBot, engine: EngineProcess, tmp_path: Path
) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with qtbot.waitSignal(engine.crashed, timeout=START_TIMEOUT_MS) as crash:
        engine.start(["--target", str(bad), "--no-draft"])
    code, tail = crash.args
    assert code != 0
    assert "broken.gguf" in tail
