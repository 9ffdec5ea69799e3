"""The transcript widget (offscreen): Markdown, highlighted code with Copy links, accepted-draft marks,
scrolling while an answer streams; and the draft flags of a real engine's stream (gemma-3-270m, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QColor, QDesktopServices, QGuiApplication, QPalette, QTextCursor
from pytestqt.qtbot import QtBot

from app.chats.store import Message
from app.services.client import EngineClient
from app.services.conversation import add_piece
from app.services.engine import EngineProcess
from app.ui.transcript import DARK, DRAFT_BACKGROUND, LIGHT, Transcript, stats_line

CODE = 'def add(a: int, b: int) -> int:\n    """Sum."""\n    return a + b'
ANSWER = f"Here it is:\n\n```python\n{CODE}\n```\n\n- one **bold** item\n- see [the docs](https://example.com/docs)\n"


@pytest.fixture
def transcript(qtbot: QtBot) -> Transcript:
    view = Transcript()
    qtbot.addWidget(view)
    view.resize(700, 400)
    view.show()
    return view


def _cursor_at(view: Transcript, text: str) -> QTextCursor:
    """A cursor selecting the first `text` in the view (its char format is that of its last character)."""
    found = view.document().find(text)
    assert not found.isNull(), f"{text!r} is not shown"
    return found


def _click(qtbot: QtBot, view: Transcript, text: str) -> None:
    cursor = _cursor_at(view, text)
    cursor.setPosition(cursor.selectionStart() + 1)
    view.ensureCursorVisible()
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.cursorRect(cursor).center())


def _background(view: Transcript, text: str) -> str:
    fmt = _cursor_at(view, text).charFormat()
    return fmt.background().color().name() if fmt.background().style() != Qt.BrushStyle.NoBrush else ""


def test_code_blocks_are_coloured_by_pygments_and_copy_puts_the_exact_code_on_the_clipboard(
    qtbot: QtBot, transcript: Transcript
) -> None:
    transcript.show_messages([{"role": "user", "content": "add?"}, {"role": "assistant", "content": ANSWER}])
    keyword = _cursor_at(transcript, "def").charFormat()
    assert keyword.foreground().color().name() == "#008000"  # Pygments' default style: bold green keywords
    assert keyword.fontWeight() >= 700
    assert _cursor_at(transcript, '"""Sum."""').charFormat().foreground().color().name() == "#ba2121"
    assert transcript.code_block("copy:1.0") == CODE

    QGuiApplication.clipboard().setText("something else")
    _click(qtbot, transcript, "Copy")
    assert QGuiApplication.clipboard().text() == CODE


def test_web_links_open_outside_and_lists_render(qtbot: QtBot, transcript: Transcript) -> None:
    opened: list[str] = []

    class Handler(QObject):
        @Slot(QUrl)
        def open(self, url: QUrl) -> None:
            opened.append(url.toString())

    handler = Handler()
    QDesktopServices.setUrlHandler("https", handler, "open")
    try:
        transcript.show_messages([{"role": "assistant", "content": ANSWER}])
        assert _cursor_at(transcript, "the docs").charFormat().anchorHref() == "https://example.com/docs"
        assert _cursor_at(transcript, "one").currentList() is not None
        assert _cursor_at(transcript, "bold").charFormat().fontWeight() >= 700
        assert "**" not in transcript.toPlainText()
        _click(qtbot, transcript, "the docs")
    finally:
        QDesktopServices.unsetUrlHandler("https")
    assert opened == ["https://example.com/docs"]


def test_a_question_keeps_its_lines_and_markup_is_shown_as_text(transcript: Transcript) -> None:
    question = "first line\nsecond line\n<b>not bold</b>"
    transcript.show_messages([{"role": "user", "content": question}])
    lines = transcript.toPlainText().replace("\u2028", "\n").splitlines()
    assert lines[-3:] == ["first line", "second line", "<b>not bold</b>"]
    transcript.show_messages([{"role": "user", "content": "Fix:\ndef f(x):\n    return x"}])
    assert transcript.toPlainText().replace("\u2028", "\n").splitlines()[-1] == "    return x"


def test_accepted_drafts_are_marked_only_when_asked(transcript: Transcript) -> None:
    content = "Plain words then drafted words.\n\n```python\nx = 1\ny = 2\n```\n"
    drafted = content.index("drafted words")
    y = content.index("y = 2")
    message = {
        "role": "assistant",
        "content": content,
        "draft_spans": [[drafted, drafted + len("drafted words")], [y, y + 5]],
    }
    transcript.show_messages([message], highlight_drafts=True)
    assert _background(transcript, "drafted words") == DRAFT_BACKGROUND
    assert _background(transcript, "Plain words") != DRAFT_BACKGROUND
    assert _background(transcript, "y = 2") == DRAFT_BACKGROUND  # its last character
    assert _background(transcript, "x = 1") != DRAFT_BACKGROUND
    assert _cursor_at(transcript, "y = 2").charFormat().foreground().color().name() == "#666666"  # a number

    transcript.show_messages([message], highlight_drafts=False)
    assert DRAFT_BACKGROUND not in transcript.toHtml()
    assert _background(transcript, "drafted words") != DRAFT_BACKGROUND


def _edits(view: Transcript) -> list[tuple[int, int, int]]:
    """Every edit of the view's document from now on: (position, characters removed, characters added)."""
    seen: list[tuple[int, int, int]] = []
    view.document().contentsChange.connect(
        lambda position, removed, added: seen.append((position, removed, added))
    )
    return seen


def _long_transcript(n_answers: int) -> list[dict]:
    block = f"Words, **bold**, `code` and a [link](https://x.org).\n\n```python\n{CODE}\n```\n\n- a\n- b\n"
    messages: list[dict] = []
    for i in range(n_answers):
        messages.append({"role": "user", "content": f"question {i}\nwith two lines"})
        messages.append({"role": "assistant", "content": block * 8, "stats": "500 tokens"})
    return messages


def test_streaming_edits_the_document_in_place_follows_the_bottom_and_respects_scrolling_up(
    qtbot: QtBot, transcript: Transcript
) -> None:
    history = _long_transcript(20)
    answer = history.pop()["content"]
    question = history.pop()
    done = [*history, question, {"role": "assistant", "content": answer, "stats": "500 tokens"}]
    fresh = Transcript()
    qtbot.addWidget(fresh)
    fresh_edits = _edits(fresh)
    fresh.show_messages(done)
    assert min(position for position, _, _ in fresh_edits) == 0  # from scratch: the whole document

    transcript.show_messages(history)
    bar = transcript.verticalScrollBar()
    edits = _edits(transcript)
    for shown in [
        [*history, question],
        *(
            [*history, question, {"role": "assistant", "content": answer[:n], "status": "writing"}]
            for n in range(20, len(answer) + 1, 40)
        ),
    ]:
        size = transcript.document().characterCount()
        # everything up to the exchange before the one in flight stays as it is
        kept = _cursor_at(transcript, "question 18").selectionStart()
        edits.clear()
        transcript.show_messages(shown)
        assert edits
        # an update edits the end of the document in place, the answer in flight (or the new question):
        # its cost follows the last message, not the 40 before it
        assert min(position for position, _, _ in edits) > kept
        assert sum(removed for _, removed, _ in edits) <= size - kept
        assert bar.value() == bar.maximum() > 0  # following the answer
    assert "(writing…)" in transcript.toPlainText()
    just_begun = {"role": "assistant", "content": "", "status": "streaming"}  # as the chat store says it
    transcript.show_messages([*history, question, just_begun])
    assert transcript.toPlainText().endswith("Assistant (writing…)")

    # the document edited in place is the one a render from scratch makes
    transcript.show_messages(done)
    assert transcript.toHtml() == fresh.toHtml()
    assert transcript.code_block("copy:39.7") == CODE

    bar.setValue(bar.maximum() // 2)  # the reader scrolled up: new text must not pull them down
    read_at = bar.value()
    transcript.show_messages([*done, {"role": "user", "content": "more"}])
    transcript.show_messages(
        [*done, {"role": "user", "content": "more"}, {"role": "assistant", "content": "a"}]
    )
    assert bar.value() == read_at < bar.maximum()
    transcript.show_messages([])
    assert "Start a conversation" in transcript.toPlainText()


def test_a_real_engine_flags_the_pieces_that_came_from_accepted_drafts(
    qtbot: QtBot, gemma_path: Path, transcript: Transcript
) -> None:
    engine = EngineProcess()
    try:
        with qtbot.waitSignal(engine.ready, timeout=120_000):
            engine.start(["--target", str(gemma_path), "--ngram", "--n-ctx", "1024"])
        client = EngineClient()
        client.configure(engine.url, engine.token)
        code = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * i}" for i in range(6))
        prompt = f"Copy this code exactly, in a python code block:\n\n```python\n{code}\n```"
        stream = client.stream_chat([{"role": "user", "content": prompt}], temperature=0.0, max_tokens=160)
        pieces: list[tuple[str, list]] = []
        deltas: list[str] = []
        stream.piece.connect(lambda text, flags: pieces.append((text, flags)))
        stream.delta.connect(deltas.append)
        with qtbot.waitSignal(stream.finished, timeout=120_000) as done:
            pass
    finally:
        engine.stop()
    accepted = done.args[1]["speculative"]["accepted"]
    assert accepted > 0
    assert "".join(t for t, _ in pieces) == "".join(deltas)
    # accepted drafts past the end (max_tokens) are counted but never sent
    assert 0 < sum(f for _, flags in pieces for f in flags) <= accepted
    spans: list[list[int]] = []
    text = ""
    for piece, flags in pieces:
        add_piece(spans, len(text), piece, flags)
        text += piece
    assert spans
    assert all(0 <= s < e <= len(text) for s, e in spans)
    transcript.show_messages([{"role": "assistant", "content": text, "draft_spans": spans}], True)
    assert DRAFT_BACKGROUND in transcript.toHtml()


def test_a_dark_palette_gives_dark_code_and_draft_colours(qtbot: QtBot) -> None:
    transcript = Transcript()
    qtbot.addWidget(transcript)
    message = {"role": "assistant", "content": "Drafted.\n\n```python\nx = 1\n```", "draft_spans": [[0, 8]]}
    transcript.show_messages([message], highlight_drafts=True)
    assert LIGHT.draft in transcript.toHtml()
    dark = QPalette(transcript.palette())
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#dddddd"))
    transcript.setPalette(dark)  # what a switch of the system to dark mode does to the widget
    html = transcript.toHtml()
    assert DARK.draft in html
    assert LIGHT.draft not in html
    transcript.setPalette(QPalette())
    assert LIGHT.draft in transcript.toHtml()


def test_an_answer_cannot_make_the_view_read_local_files(transcript: Transcript, tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG not really")
    answer = f"Look: ![x]({secret}) and ![y](file://{secret})"
    transcript.show_messages([{"role": "assistant", "content": answer}])
    assert transcript.loadResource(2, QUrl.fromLocalFile(str(secret))) is None
    assert transcript.loadResource(2, QUrl(str(secret))) is None
    bad = {"role": "user", "content": "hi", "images": ["data:image/png;base64,@@not base64@@"]}
    transcript.show_messages([bad])  # a damaged image shows as a note, not an error
    assert "could not be read" in transcript.toPlainText()


def test_a_stored_conversation_is_shown_with_each_answer_s_stats_line(transcript: Transcript) -> None:
    stats = {
        "emitted": 12,
        "tokens_per_second": 30.5,
        "drafted": 10,
        "accepted": 7,
        "mean_accepted_len": 1.7,
        "acceptance_rate": 0.7,
    }
    expected = "12 tokens · 30.5 tok/s · 1.70 tokens per target pass · 7 of 10 drafted accepted (70%)"
    assert stats_line(stats) == expected
    assert stats_line({"emitted": 3}) == "3 tokens"  # nothing drafted: no speculation figures
    question = Message(1, 1, "user", "Say **hi**", stats={"emitted": 99})
    answer = Message(
        2, 1, "assistant", "Drafted **here**", status="stopped", stats=stats, draft_spans=[[0, 7]]
    )
    transcript.show_conversation([question, answer], highlight_drafts=True)
    text = transcript.toPlainText()
    assert "Say **hi**" in text  # a question is shown as typed
    assert "99 tokens" not in text  # only answers carry stats
    assert stats_line(stats) in text
    assert "Assistant (stopped)" in text
    assert "**" not in text.split("Assistant")[-1]
    assert _background(transcript, "Drafted") == DRAFT_BACKGROUND
    assert _background(transcript, "here") != DRAFT_BACKGROUND
