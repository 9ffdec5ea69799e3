"""The engine a window runs (app.services.engine_control): the launch follows the device, the first model
and a pair loaded, and a start ends leftover engines before it starts the window's own (a real engine
process, on a file that is no model, so it ends at once)."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.services.engine import STARTING, EngineLaunch
from app.services.engine_control import EngineControl

START_TIMEOUT_MS = 120_000


def test_the_launch_follows_the_first_model_and_a_loaded_pair() -> None:
    control = EngineControl(EngineLaunch())
    assert control.launch.target is None
    control.set_target("first.gguf")
    assert control.launch.argv()[:2] == ["--target", "first.gguf"]
    control.keep_pair("target.gguf", None, True, "projector.gguf")
    argv = control.launch.argv()
    assert argv[:2] == ["--target", "target.gguf"]
    assert "--ngram" in argv
    assert argv[argv.index("--mmproj") + 1] == "projector.gguf"
    control.keep_pair("target.gguf", "drafter.gguf", False, None)
    assert control.launch.draft_model == "drafter.gguf"
    assert "--mmproj" not in control.launch.argv()


def test_a_start_ends_leftovers_first_then_starts_the_engine_on_the_launch(
    qtbot: QtBot, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    control = EngineControl(EngineLaunch(str(broken), draft={"mode": "none"}))
    seen: list[str] = []
    control.leftoversEnded.connect(lambda notes: seen.append("leftovers ended"))
    control.process.stateChanged.connect(seen.append)
    with qtbot.waitSignal(control.process.crashed, timeout=START_TIMEOUT_MS) as crash:
        control.start()
    assert seen[:2] == ["leftovers ended", STARTING]
    assert "broken.gguf" in crash.args[1]
