"""The real window (offscreen) against a real engine subprocess (gemma-3-270m on the CPU)."""

from __future__ import annotations

import base64
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QUrl
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QSystemTrayIcon
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore
from app.config import SamplingSettings
from app.services.api_server import ApiKeys
from app.services.engine import READY, EngineLaunch
from app.ui.main_window import MainWindow
from app.ui.session import WindowSession
from app.ui.transcript import DRAFT_BACKGROUND
from tests.support.mmproj import png, write_colour_mmproj, write_tiny_mmproj

START_MS = 300_000  # generous: a model loads, calibrates and answers slowly on a busy 2-core machine
ANSWER_MS = 300_000  # generous: a model loads, calibrates and answers slowly on a busy 2-core machine


def _window(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, max_tokens: int = 24, api_keys: ApiKeys | None = None
) -> MainWindow:
    window = MainWindow(
        store,
        EngineLaunch(str(gemma_path), draft={"mode": "ngram"}, engine={"n_ctx": 2048}),
        sampling=SamplingSettings(temperature=0.0, max_tokens=max_tokens),
        api_keys=api_keys,
        api_port=0,  # any free port: tests run side by side
        session=WindowSession(store.path.with_name("window.ini")),  # each test its own
    )
    qtbot.addWidget(window)
    window.show()
    assert window.conversation.n_ctx == 2048  # the launch's, until the engine says what it loaded
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.start_engine()
    return window


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _ask(qtbot: QtBot, window: MainWindow, text: str) -> str:
    window.input.setPlainText(text)
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.send_button.click()
    return done.args[0]


def test_send_stream_switch_regenerate_and_find_the_history_after_a_restart(
    qtbot: QtBot, store: ChatStore, gemma_path: Path
) -> None:
    window = _window(qtbot, store, gemma_path)
    deltas: list[str] = []
    window.input.setPlainText("The capital of France is")
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.send_button.click()
        # the answer and its stream exist once Send was clicked
        window.conversation.answer.stream.delta.connect(deltas.append)
    assert done.args[0] == "complete"
    assert done.args[1]["completion_tokens"] > 0  # the engine's usage came with the end
    assert len(deltas) > 1  # the text arrived in pieces
    first = window.conversation.current
    assert window.conversations.model.titles() == ["The capital of France is"]
    answer = store.messages(first)[-1]
    assert answer.role == "assistant"
    assert answer.status == "complete"
    assert answer.content == "".join(deltas)
    assert answer.content.strip()[:20] in window.transcript.toPlainText()

    window.conversations.new_button.click()
    assert _ask(qtbot, window, "Two plus two equals") == "complete"
    second = window.conversation.current
    assert second != first
    window.conversation.select(first)
    assert "The capital of France is" in window.transcript.toPlainText()
    assert "Two plus two" not in window.transcript.toPlainText()

    before = store.messages(first)
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS):
        window.regenerate_button.click()
    after = store.messages(first)
    assert len(after) == len(before)
    assert after[-1].id != before[-1].id  # a new answer replaced the old one
    assert after[-1].content == before[-1].content  # greedy: the same text again

    # Edit and resend: the question comes back into the box; nothing changes until it is sent again.
    window.edit_button.click()
    assert window.input.toPlainText() == "The capital of France is"
    assert window.send_button.text() == "Resend"
    assert store.messages(first) == after
    window.input.setPlainText("The capital of Italy is")
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS):
        window.send_button.click()
    edited = store.messages(first)
    assert [m.role for m in edited] == ["user", "assistant"]
    assert edited[0].content == "The capital of Italy is"
    assert window.send_button.text() == "Send"

    window.close()  # stops the engine
    assert window.engine.state != READY
    again = _window(qtbot, store, gemma_path)
    titles = again.conversations.model.titles()
    # newest activity first: the regenerated conversation is on top
    # the edited question was the conversation's first: its title follows it
    assert titles == ["The capital of Italy is", "Two plus two equals"]
    again.conversations.choose_row(0)
    assert again.conversation.current == first
    assert "The capital of Italy is" in again.transcript.toPlainText()
    assert "READY" in again.log_panel.view.toPlainText()  # View > Engine log shows the engine's own output

    again.conversation.rename(second, "  Arithmetic ")
    again.conversation.delete(first)
    titles = again.conversations.model.titles()
    assert titles == ["Arithmetic"]
    assert store.messages(first) == []
    assert again.conversation.current is None
    again.close()


def test_stop_mid_stream_keeps_the_partial_answer(qtbot: QtBot, store: ChatStore, gemma_path: Path) -> None:
    window = _window(qtbot, store, gemma_path, max_tokens=400)
    window.input.setPlainText("Write a long story about a lighthouse keeper.")
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.send_button.click()
        qtbot.waitUntil(lambda: len(window.conversation.answer_text) > 20, timeout=ANSWER_MS)
        window.stop_button.click()
    assert done.args[0] == "stopped"
    kept = store.messages(window.conversation.current)[-1]
    assert kept.status == "stopped"
    assert len(kept.content) > 20
    assert "(stopped)" in window.transcript.toPlainText()
    window.close()


def test_an_engine_killed_mid_answer_keeps_it_as_interrupted_and_offers_a_restart(
    qtbot: QtBot, store: ChatStore, gemma_path: Path
) -> None:
    window = _window(qtbot, store, gemma_path, max_tokens=400)
    window.input.setPlainText("Write a long story about a lighthouse keeper.")
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.send_button.click()
        qtbot.waitUntil(lambda: len(window.conversation.answer_text) > 20, timeout=ANSWER_MS)
        os.kill(window.engine.pid, signal.SIGKILL)
    assert done.args[0] == "interrupted"
    kept = store.messages(window.conversation.current)[-1]
    assert kept.status == "interrupted"
    assert len(kept.content) > 20
    assert window.banner.isVisible()
    assert window.banner.restart_button.isVisible()
    assert "stopped unexpectedly" in window.banner.text()
    # the reason, not the engine's last line of output ("READY port=...")
    assert "READY" not in window.banner.text()
    assert "killed" in window.banner.text()
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.banner.restart_button.click()
    # the answer cut short is offered to be carried on, or written again
    assert window.banner.isVisible()
    assert not window.banner.restart_button.isVisible()
    assert window.banner.continue_button.isVisible()
    assert window.banner.regenerate_button.isVisible()
    assert "cut short" in window.banner.text()
    assert window.continue_button.isVisible()
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.banner.continue_button.click()
        body = json.loads(window.conversation.answer.stream.body)
    assert done.args[0] == "complete"
    assert body["continue_final_message"] is True
    assert body["messages"][-1] == {"role": "assistant", "content": kept.content}
    carried = store.messages(window.conversation.current)[-1]
    assert carried.id == kept.id  # carried on in place: still one answer
    assert carried.status == "complete"
    assert carried.content.startswith(kept.content)
    assert len(carried.content) > len(kept.content)
    assert not window.banner.isVisible()
    assert not window.continue_button.isVisible()
    assert _ask(qtbot, window, "Hello") == "complete"
    window.close()


def test_a_damaged_chat_file_is_reported_in_the_window(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    path.write_bytes(b"this is not a database at all" * 100)
    with ChatStore(path) as store:
        window = MainWindow(store, EngineLaunch(), session=WindowSession(tmp_path / "window.ini"))
        qtbot.addWidget(window)
        window.show()
        assert window.banner.isVisible()
        assert not window.banner.restart_button.isVisible()
        assert "could not be read" in window.banner.text()
        assert store.recovered_from is not None
        assert store.recovered_from.name in window.banner.text()
        window.close()


def test_first_start_without_a_model_downloads_it_and_starts_the_engine(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    from app.catalog.download import FileSpec
    from app.catalog.packaged import GEMMA_270M
    from tests.support.fake_hub import FakeHub

    with FakeHub() as server:
        server.add_file("test-org/default-GGUF", "model.gguf", gemma_path, sha256=GEMMA_270M.sha256)
        window = MainWindow(
            store,
            EngineLaunch(draft={"mode": "ngram"}, engine={"n_ctx": 1024}),
            sampling=SamplingSettings(temperature=0.0, max_tokens=8),
            session=WindowSession(tmp_path / "window.ini"),
        )
        qtbot.addWidget(window)
        window.show()
        files = [FileSpec("test-org/default-GGUF", "model.gguf", "target")]
        window.first_run.offer(files, tmp_path / "models", "the test model", endpoint=server.url)
        assert window.banner.download_button.isVisible()
        assert "the test model" in window.banner.text()
        assert not window.send_button.isEnabled()
        progress: list[str] = []
        with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
            window.banner.download_button.click()
            window.first_run.task.progress.connect(lambda p: progress.append(window.banner.text()))
        assert any("Downloading model.gguf" in text for text in progress)
        installed = tmp_path / "models" / "test-org" / "default-GGUF" / "model.gguf"
        assert window.engine_control.launch.target == str(installed)
        assert window.engine_control.launch.argv()[:3] == ["--target", str(installed), "--ngram"]
        assert not window.banner.isVisible()
        assert not window.banner.download_button.isVisible()
        assert _ask(qtbot, window, "Hello") == "complete"
        window.close()


def _switch(qtbot: QtBot, window: MainWindow, on: bool) -> dict:
    with qtbot.waitSignal(window.api_panel.changed, timeout=30_000) as changed:
        window.api_panel.toggle.click()
    assert changed.args[0]["open"] is on, window.api_panel.status.text()
    return changed.args[0]


def test_the_api_server_switch_serves_the_openai_client_and_a_restart_keeps_it_on(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    import openai
    from keyrings.alt.file import PlaintextKeyring

    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")  # a file keyring stands in where no OS keyring runs
    window = _window(qtbot, store, gemma_path, api_keys=ApiKeys(backend))
    panel = window.api_panel
    qtbot.waitUntil(lambda: panel.model != "model", timeout=10_000)  # the engine's model id arrived

    info = _switch(qtbot, window, True)
    assert info["host"] == "127.0.0.1"
    assert not info["auth"]
    client = openai.OpenAI(base_url=info["url"], api_key="not-needed", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [panel.model]
    reply = client.chat.completions.create(
        model=panel.model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
    assert panel.model in panel.config.toPlainText()  # the settings shown name the served model...
    assert info["url"] in panel.config.toPlainText()  # ...and its address

    _switch(qtbot, window, False)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()

    # From the network: a key is required, and the shown key is the one that works.
    panel.lan.setChecked(True)
    info = _switch(qtbot, window, True)
    assert info["host"] == "0.0.0.0"
    assert info["auth"]
    key = panel.key.text()
    assert key
    assert "keyring" in panel.key_note.text()
    assert panel.address.text() == info["url"]  # one line, never wrapped
    for name in ("Continue", "curl"):
        panel.client_choice.setCurrentText(name)
        assert key not in panel.config.toPlainText()  # the key shows only when asked...
    panel.show_key.click()
    assert key in panel.config.toPlainText()  # ...with Show
    panel.show_key.click()
    # greyed while serving, with the reason
    assert not panel.port.isEnabled()
    assert panel.port.toolTip() == "Stop the API server to change this."
    assert not panel.lan.isEnabled()
    assert panel.lan.toolTip() == "Stop the API server to change this."
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=info["url"], api_key="wrong", max_retries=0).models.list()
    lan = openai.OpenAI(base_url=info["url"], api_key=key, max_retries=0, timeout=60)
    assert lan.models.list().data[0].id == panel.model

    # The engine restarts (a crash, a model change): the switch stays on and the listener comes back.
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.restart_engine()
    qtbot.waitUntil(lambda: bool(panel.info.get("open")), timeout=30_000)
    again = openai.OpenAI(base_url=panel.info["url"], api_key=key, max_retries=0, timeout=60)
    assert again.models.list().data[0].id == panel.model


def test_the_devices_panel_lists_what_was_found_and_restarts_the_engine_on_a_chosen_device(
    qtbot: QtBot, store: ChatStore, gemma_path: Path
) -> None:
    window = _window(qtbot, store, gemma_path)
    panel = window.devices_panel
    qtbot.waitUntil(
        lambda: "Target" in panel.target.text() and "gemma" in panel.target.text().lower(), timeout=10_000
    )
    with qtbot.waitSignal(panel.scanned, timeout=90_000):
        panel.show()  # the first showing starts a scan in a child process
    kinds = [d.get("kind") for d in panel.devices]
    assert "cpu" in kinds  # the processor is always there, with its cores
    assert panel.table.rowCount() == len(panel.devices)
    cpu = next(d for d in panel.devices if d.get("kind") == "cpu")
    assert cpu.get("cores", 0) >= 1
    assert panel.found.text()

    panel.choice.setCurrentIndex(panel.choice.findData("cpu"))
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        panel.apply.click()
    assert window.engine_control.launch.engine["device"] == "cpu"
    argv = window.engine_control.launch.argv()
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv.count("--device") == 1
    qtbot.waitUntil(lambda: panel.props.get("target", {}).get("device") == "cpu", timeout=10_000)
    assert "cpu" in panel.target.text()
    assert _ask(qtbot, window, "Say hi.") == "complete"  # the restarted engine answers
    # each answer carries its speed and speculation figures, in the transcript and the status bar
    assert "tok/s" in window.transcript.toPlainText()
    assert "tokens" in window.stats_label.text()


def test_drafts_highlighted_images_refused_without_vision_the_context_count_and_the_library(
    qtbot: QtBot, store: ChatStore, gemma_path: Path, tmp_path: Path
) -> None:
    window = _window(qtbot, store, gemma_path, max_tokens=64)
    code = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
    assert _ask(qtbot, window, f"Repeat this code exactly:\n```python\n{code}```") == "complete"
    answer = store.messages(window.conversation.current)[-1]
    assert answer.draft_spans  # stored with the answer: text the target took from n-gram drafts
    assert all(0 <= a < b <= len(answer.content) for a, b in answer.draft_spans)
    assert DRAFT_BACKGROUND not in window.transcript.toHtml()
    window.highlight_drafts.setChecked(True)
    assert DRAFT_BACKGROUND in window.transcript.toHtml()
    # the engine's count of the exchange, against the context the engine reported
    assert "of 2,048 tokens" in window.input.count.text()
    assert not window.input.count.text().startswith("context: 0 ")

    picture = QImage(32, 24, QImage.Format.Format_RGB32)
    picture.fill(QColor("red"))
    png = tmp_path / "red.png"
    assert picture.save(str(png))
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("just text")
    refusals: list[str] = []
    window.input.refused.connect(refusals.append)
    window.input.add_image_file(not_an_image)
    assert len(refusals) == 1
    assert "notes.png" in refusals[0]
    assert window.input.images == []
    assert not window.input.no_vision.isVisible()
    window.input.add_image_file(png)
    assert window.input.images[0].startswith("data:image/png;base64,")
    # gemma-3-270m reads no images: the box says so as the image is added, with the way to one that does
    assert window.input.no_vision.isVisible()
    assert "cannot read images" in window.input.no_vision.text()
    assert 'href="library:images"' in window.input.no_vision.text()
    before = store.messages(window.conversation.current)
    window.input.setPlainText("What colour is this?")
    window.send_button.click()
    assert store.messages(window.conversation.current) == before  # nothing sent, nothing stored
    assert window.input.images  # the question and its image stay in the box
    assert not window.banner.isVisible()  # said in the box, where the image is, not in a banner
    window.input.no_vision.linkActivated.emit("library:images")
    assert window.library_panel.isVisible()  # opened on its "Images" choice
    window.library_panel.hide()
    window.input.remove_image(0)
    assert not window.input.no_vision.isVisible()  # the warning goes with the image
    window.input.clear()

    # the tray option needs a system tray; without one it says so and stays off
    window.tray.action.setChecked(True)
    assert window.tray.action.isChecked() == QSystemTrayIcon.isSystemTrayAvailable()

    # a pair loaded from the model library (no restart) is what a later restart starts
    panel = window.library_panel
    panel.show()
    panel.local_files.import_file(gemma_path)  # registered where it is (the models folder may not list it)
    projector = str(write_tiny_mmproj(tmp_path / "tiny-mmproj.gguf", n_embd=640).resolve())
    panel.local_files.import_file(Path(projector))
    wanted = str(gemma_path.resolve())
    # the library lists its files in a thread: a minute was seen not to be enough on a busy 2-core machine
    qtbot.waitUntil(lambda: panel.picker.target_choice.findData(wanted) >= 0, timeout=START_MS)
    qtbot.waitUntil(lambda: panel.picker.projector_choice.findData(projector) >= 0, timeout=START_MS)
    assert panel.picker.target_choice.findData(projector) < 0  # a projector is no target
    panel.picker.choose(wanted, "ngram", projector)
    qtbot.waitUntil(lambda: panel.picker.target_choice.currentData() == wanted, timeout=START_MS)
    assert panel.picker.projector_choice.currentData() == projector
    assert panel.loader.use_button.isEnabled()
    with qtbot.waitSignal(panel.loader.pairLoaded, timeout=START_MS):
        panel.loader.use_pair()
    assert (window.engine_control.launch.target, window.engine_control.launch.draft["mode"]) == (
        str(gemma_path.resolve()),
        "ngram",
    )
    assert window.engine_control.launch.engine["mmproj"] == projector
    argv = window.engine_control.launch.argv()
    assert argv[:2] == ["--target", str(gemma_path.resolve())]
    assert "--ngram" in argv
    assert argv[argv.index("--mmproj") + 1] == projector
    qtbot.waitUntil(
        lambda: window.status.vision, timeout=10_000
    )  # loaded with its projector: it reads images
    # ...and a restart (as after a crash) starts the engine on that pair
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.restart_engine()
        assert not window.status.vision  # a new engine process: nothing known until its /props answers
    qtbot.waitUntil(lambda: window.status.vision, timeout=10_000)
    window.tray.action.setChecked(False)
    window.close()


def test_an_image_dropped_in_the_question_is_sent_and_answered(
    qtbot: QtBot, store: ChatStore, qwen_path: Path, tmp_path: Path
) -> None:
    # a projector built to carry a solid colour to the colour's word (tests/support/mmproj.py)
    colours = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
    projector = write_colour_mmproj(tmp_path / "colour-mmproj.gguf", qwen_path, colours)
    window = MainWindow(
        store,
        EngineLaunch.from_argv(
            ["--target", str(qwen_path), "--mmproj", str(projector), "--ngram", "--n-ctx", "2048"]
        ),
        sampling=SamplingSettings(temperature=0.0, max_tokens=16),
        api_port=0,
        session=WindowSession(tmp_path / "window.ini"),
    )
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.engine.ready, timeout=START_MS):
        window.start_engine()
    qtbot.waitUntil(lambda: window.status.vision, timeout=10_000)  # /props says the engine reads images

    picture = tmp_path / "blue.png"
    picture.write_bytes(png(32, 32, (0, 0, 255)))
    drop = QMimeData()
    drop.setUrls([QUrl.fromLocalFile(str(picture))])
    window.input.edit.insertFromMimeData(drop)  # what a drop or a paste of the file hands the box
    assert len(window.input.images) == 1
    window.input.setPlainText("What colour is this image? Answer with one word.")
    with qtbot.waitSignal(window.conversation.answerFinished, timeout=ANSWER_MS) as done:
        window.send_button.click()
        body = json.loads(window.conversation.answer.stream.body)
    assert done.args[0] == "complete"
    parts = body["messages"][-1]["content"]
    assert {"type": "text", "text": "What colour is this image? Answer with one word."} in parts
    uri = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
    assert base64.b64decode(uri.removeprefix("data:image/png;base64,")) == picture.read_bytes()
    assert {"temperature": 0.0, "max_tokens": 16}.items() <= body.items()  # the window's sampling went too
    question, answer = store.messages(window.conversation.current)
    assert question.images == [uri]  # kept with the question
    assert answer.content.strip().strip(".").lower() == "blue"
    assert "blue" in window.transcript.toPlainText().lower().split("assistant")[-1]
    assert window.input.images == []  # sent: the box is empty again
    window.close()
