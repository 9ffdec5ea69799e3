"""The conversation shown and its answer, against a real SQLite store, with the engine not started: what
it stores, what it refuses, the signals it gives; answers from a real engine are in tests/ui/test_gui.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.chats.store import ChatStore, Message
from app.config import SamplingSettings
from app.services.client import EngineClient
from app.services.conversation import (
    CHARS_PER_TOKEN,
    ActiveConversation,
    add_piece,
    api_content,
    estimate_tokens,
    title_of,
)
from app.services.engine import STOPPED, EngineProcess


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


@pytest.fixture
def conversation(qtbot: QtBot, store: ChatStore) -> ActiveConversation:
    engine = EngineProcess()
    assert engine.state == STOPPED
    return ActiveConversation(store, EngineClient(), engine, SamplingSettings(temperature=0.0), 2048)


def test_add_piece_turns_streamed_flags_into_spans() -> None:
    spans: list[list[int]] = []
    text = ""
    for piece, flags in [("Hello", [False]), (" world, again", [True, True, True, False]), ("!", [True])]:
        add_piece(spans, len(text), piece, flags)
        text += piece
    # 3 of 4 tokens drafted: the first 3/4 of " world, again" (13 characters, so 10)
    assert spans == [[5, 15], [18, 19]]
    add_piece(spans, 19, "??", [])  # a piece without flags (an older engine) marks nothing
    add_piece(spans, 21, "abc", True)
    add_piece(spans, 24, "de", True)
    assert spans == [[5, 15], [18, 19], [21, 26]]


def test_titles_contents_and_estimates() -> None:
    assert title_of("  Where to go in Kyoto?\nTwo days.") == "Where to go in Kyoto?"
    assert title_of("x" * 60) == "x" * 48 + "..."
    assert title_of("   ") == "New chat"
    plain = Message(1, 1, "user", "hello")
    assert api_content(plain) == "hello"
    pictured = Message(2, 1, "user", "what is this?", images=["data:image/png;base64,AAAA"])
    assert api_content(pictured) == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    assert (
        api_content(Message(3, 1, "user", "", images=["data:image/png;base64,AAAA"]))[0]["type"]
        == "image_url"
    )
    messages = [{"role": "user", "content": "a" * 30}, {"role": "user", "content": api_content(pictured)}]
    assert estimate_tokens(messages) == (30 + len("what is this?")) // CHARS_PER_TOKEN + 8  # images: no text


def test_only_the_sampling_fields_set_go_with_a_request(conversation: ActiveConversation) -> None:
    assert conversation.request_sampling() == {"temperature": 0.0}
    conversation.use_sampling(max_tokens=64)
    assert conversation.request_sampling() == {"temperature": 0.0, "max_tokens": 64}
    assert conversation.sampling.top_p == SamplingSettings().top_p  # unset: the engine's own settings rule
    with pytest.raises(ValueError, match="max_tokens"):
        conversation.use_sampling(max_tokens=0)
    assert conversation.request_sampling() == {"temperature": 0.0, "max_tokens": 64}


def test_new_select_rename_delete_and_their_signals(
    qtbot: QtBot, store: ChatStore, conversation: ActiveConversation
) -> None:
    with qtbot.waitSignals([conversation.listChanged, conversation.changed], timeout=10_000):
        conversation.new()
    first = conversation.current
    assert first is not None
    assert store.conversation(first).title == "New chat"
    store.add_message(first, "user", "x" * 30)
    conversation.new()
    second = conversation.current
    assert second != first
    assert (conversation.context_used, conversation.context_estimated) == (0, False)
    with qtbot.waitSignal(conversation.contextChanged, timeout=10_000):
        conversation.select(first)
    # estimated from the stored text until the engine counts an answer
    assert (conversation.context_used, conversation.context_estimated) == (30 // CHARS_PER_TOKEN + 4, True)
    assert [m.content for m in conversation.shown()] == ["x" * 30]
    with qtbot.waitSignal(conversation.listChanged, timeout=10_000):
        conversation.rename(first, "  Thirty x  ")
    assert store.conversation(first).title == "Thirty x"
    conversation.delete(second)
    assert conversation.current == first  # another conversation went: the one shown stays
    conversation.delete(first)
    assert conversation.current is None
    assert conversation.shown() == []
    assert store.conversations() == []


def test_nothing_is_sent_or_stored_while_the_engine_is_not_ready(
    qtbot: QtBot, store: ChatStore, conversation: ActiveConversation
) -> None:
    assert not conversation.can_ask
    with qtbot.assertNotEmitted(conversation.listChanged):
        assert not conversation.send("Hello", [])
    assert store.conversations() == []
    assert not conversation.busy
    assert conversation.answer_text == ""
    conversation.regenerate()  # no conversation: nothing to do
    conversation.stop()
    conversation.end_answer("stopped")
    assert store.conversations() == []


def test_editing_the_last_question(qtbot: QtBot, store: ChatStore, conversation: ActiveConversation) -> None:
    assert conversation.edit_last() is None  # nothing asked yet
    conversation.new()
    c = conversation.current
    assert c is not None
    store.add_message(c, "user", "first question", images=["data:image/png;base64,AAAA"])
    store.add_message(c, "assistant", "first answer")
    last = store.add_message(c, "user", "second question")
    assert conversation.last_question() == last.id
    with qtbot.waitSignal(conversation.editingChanged, timeout=10_000) as editing:
        question = conversation.edit_last()
    assert editing.args == [True]
    assert question is not None
    assert (question.id, question.content) == (last.id, "second question")
    assert conversation.editing == last.id
    assert len(store.messages(c)) == 3  # nothing changes until it is sent again
    with qtbot.waitSignal(conversation.editingChanged, timeout=10_000) as editing:
        conversation.new()  # leaving the conversation leaves the edit
    assert editing.args == [False]
    assert conversation.editing is None
    conversation.select(c)
    conversation.edit_last()
    with qtbot.waitSignal(conversation.changed, timeout=10_000):
        conversation.forget()  # all data deleted
    assert (conversation.current, conversation.editing) == (None, None)
