"""The conversation the window shows and its answer in flight: the stream, the store writes as it
streams, the context count.

Every question and every stretch of a streaming answer goes to the chat store before anything else, so
a crash of the engine or of the app loses nothing but the tokens in flight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.chats.store import ChatStore, Message, trim_to_context
from app.config import SamplingSettings
from app.services.client import ChatStream, EngineClient
from app.services.engine import CRASHED, READY, EngineProcess

SAVE_EVERY_MS = 300  # a streaming answer reaches the store at least this often
CRASH_GRACE_MS = 1500
CHARS_PER_TOKEN = 3  # a conservative estimate for trimming history before the engine counts exactly
MIN_PROMPT_TOKENS = 256  # room the history keeps however many tokens the answer may take
TITLE_CHARS = 48


def api_content(m: Message) -> Any:
    """A stored message as the API takes it: text, or text and images as parts."""
    if not m.images:
        return m.content
    parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    return parts + [{"type": "image_url", "image_url": {"url": uri}} for uri in m.images]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """Tokens an API message list takes, estimated from its text (the engine counts exactly)."""
    return sum(len(_text(m["content"])) for m in messages) // CHARS_PER_TOKEN + 4 * len(messages)


def title_of(text: str) -> str:
    """A conversation's title from its first question: the first line, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line[:TITLE_CHARS] + ("..." if len(line) > TITLE_CHARS else "")


def add_piece(spans: list[list[int]], start: int, text: str, flags: Sequence[bool] | bool) -> None:
    """Record which characters of `text`, appended to an answer at `start`, came from accepted drafts.

    `flags` is either one flag for the whole piece or the engine's per-token `speculative_tokens`.
    The engine sends one piece per speculative step, its accepted draft tokens first and the target's
    own token last; the per-token boundaries are not sent, so the drafted share of the tokens is laid
    over the same share of the characters, from the start. Adjacent drafted ranges are merged.
    """
    if isinstance(flags, bool):
        drafted = len(text) if flags else 0
    else:
        n_drafted = sum(1 for f in flags if f)
        drafted = round(len(text) * n_drafted / len(flags)) if flags else 0
    if drafted <= 0:
        return
    end = start + drafted
    if spans and spans[-1][1] == start:
        spans[-1][1] = end
    else:
        spans.append([start, end])


class Answer(QObject):
    """One answer in flight: its stream, its text and accepted-draft spans as they grow, written to the
    store every SAVE_EVERY_MS and once more when it ends.

    A broken connection is often the first sign of an engine crash: the answer waits CRASH_GRACE_MS for
    the process to report it, so the text is kept as interrupted rather than failed.
    """

    grew = Signal()
    ended = Signal(str, dict)  # the status stored (complete, stopped, interrupted, error), usage

    def __init__(
        self,
        store: ChatStore,
        message: Message,
        stream: ChatStream,
        engine: EngineProcess,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.message = message
        self.stream = stream
        self.engine = engine
        self.text = message.content  # a continued answer grows from what it had
        self.spans: list[list[int]] = [list(s) for s in message.draft_spans]  # [start, end) of drafted text
        self.error = ""
        self.done = False
        stream.piece.connect(self._piece)
        stream.finished.connect(self._finished)
        stream.failed.connect(self._failed)
        self._saver = QTimer(self, interval=SAVE_EVERY_MS, timeout=self._save)
        self._saver.start()

    def stop(self) -> None:
        """Close the connection: the engine stops generating, and the answer ends as stopped."""
        self.stream.abort()

    def end(self, status: str, usage: dict[str, Any] | None = None) -> None:
        if self.done:
            return
        self.done = True
        for signal in (self.stream.piece, self.stream.finished, self.stream.failed):
            signal.disconnect()
        self.stream.abort()
        self.stream.deleteLater()
        self._saver.stop()
        usage = usage or {}
        self.store.update_answer(self.message.id, self.text, status, usage.get("speculative"), self.spans)
        self.ended.emit(status, usage)

    def _piece(self, text: str, flags: list) -> None:
        add_piece(self.spans, len(self.text), text, flags)
        self.text += text
        self.grew.emit()

    def _save(self) -> None:
        self.store.update_answer(self.message.id, self.text, draft_spans=self.spans)

    def _finished(self, reason: str, usage: dict) -> None:
        self.end("stopped" if reason == "aborted" else "complete", usage)

    def _failed(self, message: str) -> None:
        QTimer.singleShot(CRASH_GRACE_MS, self, lambda: self._failed_after_grace(message))

    def _failed_after_grace(self, message: str) -> None:
        if self.done:
            return  # the engine's crash ended it first, as interrupted
        if self.engine.state == CRASHED:
            self.end("interrupted")
            return
        self.error = message
        self.end("error")


class ActiveConversation(QObject):
    """The conversation shown (`current`; None until a new chat's first question) and its answer in flight.

    `sampling` holds the window's sampling; the fields set in it (the command line's, the settings
    dialog's) go with every request, under the conversation's own overrides, and the engine fills in
    the rest from its settings. `context_used` is the engine's count after an answer, or an estimate
    from the stored text (`context_estimated`) after a switch.
    """

    changed = Signal()  # the conversation shown changed, or its answer began or ended: show it again
    answerGrew = Signal()
    answerFinished = Signal(str, dict)  # the status the answer ended with, usage
    failed = Signal(str)  # an answer that failed, in words
    listChanged = Signal()  # conversations were added, renamed, deleted, or moved up by new activity
    trimmed = Signal(int)  # oldest messages left out of the request: the conversation outgrew the context
    contextChanged = Signal()
    editingChanged = Signal(bool)

    def __init__(
        self,
        store: ChatStore,
        client: EngineClient,
        engine: EngineProcess,
        sampling: SamplingSettings,
        n_ctx: int,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.client = client
        self.engine = engine
        self.sampling = sampling
        self.n_ctx = n_ctx
        self.current: int | None = None
        self.editing: int | None = None  # the question being edited: sending replaces it and what followed
        self.answer: Answer | None = None
        self.context_used = 0
        self.context_estimated = False
        self._asked_tokens = 0
        engine.crashed.connect(lambda _code, _tail: self.end_answer("interrupted"))

    @property
    def busy(self) -> bool:
        return self.answer is not None

    @property
    def can_ask(self) -> bool:
        return not self.busy and self.engine.state == READY

    @property
    def answer_text(self) -> str:
        return self.answer.text if self.answer is not None else ""

    def request_sampling(self) -> dict[str, Any]:
        """The sampling sent with every request (the fields set in `sampling`)."""
        return self.sampling.model_dump(include=self.sampling.model_fields_set)

    def use_sampling(self, **values: Any) -> None:
        """Send these sampling fields from now on (validated by SamplingSettings)."""
        self.sampling = SamplingSettings.model_validate({**self.request_sampling(), **values})

    # --- choosing ----------------------------------------------------------------------------------

    def select(self, conversation_id: int | None) -> None:
        if self.busy:
            return
        if conversation_id != self.current:
            self.stop_editing()
            dropped = self._drop_if_empty(self.current)
            self.current = conversation_id
            self.count_context()
            if dropped:
                self.listChanged.emit()
        self.changed.emit()

    def new(self) -> None:
        """Start a new chat; an empty one shown stays the new one (empty chats do not pile up)."""
        if self.busy:
            return
        self.stop_editing()
        if self.current is None or not self._is_empty(self.current):
            self.current = self.store.create_conversation().id
            self.listChanged.emit()
        self.count_context()
        self.changed.emit()

    def _is_empty(self, conversation_id: int) -> bool:
        conv = self.store.conversation(conversation_id)
        return not (self.store.messages(conversation_id) or conv.system_prompt or conv.settings)

    def _drop_if_empty(self, conversation_id: int | None) -> bool:
        """Delete a chat left without a message (nor a prompt or settings of its own); True if it went."""
        if conversation_id is None or not self._is_empty(conversation_id):
            return False
        self.store.delete_conversation(conversation_id)
        return True

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.update_conversation(conversation_id, title=title.strip())
        self.listChanged.emit()

    def delete(self, conversation_id: int) -> None:
        if self.busy:
            return
        self.store.delete_conversation(conversation_id)
        if self.current == conversation_id:
            self.current = None
            self.stop_editing()
            self.count_context()
        self.listChanged.emit()
        self.changed.emit()

    def forget(self) -> None:
        """The store was emptied (delete all): nothing is shown."""
        self.current = None
        self.stop_editing()
        self.count_context()
        self.changed.emit()

    def shown(self) -> list[Message]:
        """The messages of the conversation shown, the answer in flight as far as it came."""
        if self.current is None:
            return []
        messages = self.store.messages(self.current)
        if self.answer is None:
            return messages
        live = self.answer
        return [
            dataclasses.replace(m, content=live.text, draft_spans=live.spans)
            if m.id == live.message.id
            else m
            for m in messages
        ]

    # --- asking ------------------------------------------------------------------------------------

    def send(self, text: str, images: list[str]) -> bool:
        """Store the question (in place of the one being edited) and ask for its answer."""
        text = text.strip()
        if not (text or images) or not self.can_ask:
            return False
        if self.editing is not None and self.current is not None:
            self.store.truncate_from(self.editing)
            self.stop_editing()
        title = title_of(text or "Image question")
        if self.current is None:
            self.current = self.store.create_conversation(title).id
        elif not self.store.messages(self.current):
            self.store.update_conversation(self.current, title=title)
        self.store.add_message(self.current, "user", text, images=images)
        self.listChanged.emit()
        self._ask()
        return True

    @property
    def can_regenerate(self) -> bool:
        """A question to answer again: the conversation holds one."""
        return self.current is not None and self.last_question() is not None

    def cut_short(self) -> Message | None:
        """The shown conversation's last answer when it was cut short (interrupted or stopped) with text
        to carry on from, else None."""
        messages = self.store.messages(self.current) if self.current is not None else []
        last = messages[-1] if messages else None
        if last is None or last.role != "assistant" or not last.content.strip():
            return None
        return last if last.status in ("interrupted", "stopped") else None

    def last_stats(self) -> dict[str, Any]:
        """The speculation figures of the shown conversation's last answer ({} if none)."""
        messages = self.store.messages(self.current) if self.current is not None else []
        answers = [m for m in messages if m.role == "assistant" and m.stats]
        return dict(answers[-1].stats) if answers else {}

    def last_question(self) -> int | None:
        if self.current is None:
            return None
        return next((m.id for m in reversed(self.store.messages(self.current)) if m.role == "user"), None)

    def edit_last(self) -> Message | None:
        """Start editing the last question and return it; nothing changes until it is sent again."""
        question = self.last_question()
        if question is None or self.busy:
            return None
        self.editing = question
        self.editingChanged.emit(True)
        return self.store.message(question)

    def stop_editing(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.editingChanged.emit(False)

    def regenerate(self) -> None:
        """Replace the last answer with a new one."""
        if self.current is None or self.busy:
            return
        messages = self.store.messages(self.current)
        if messages and messages[-1].role == "assistant":
            self.store.truncate_from(messages[-1].id)
        if self.store.messages(self.current):
            self._ask()

    def continue_answer(self) -> bool:
        """Carry on the last answer from where it was cut short (the engine's continue_final_message)."""
        last = self.cut_short()
        if last is None or not self.can_ask:
            return False
        self.store.update_answer(last.id, last.content, "streaming", draft_spans=last.draft_spans)
        self._ask(continued=self.store.message(last.id))
        return True

    def stop(self) -> None:
        if self.answer is not None:
            self.answer.stop()

    def end_answer(self, status: str) -> None:
        """End the answer in flight now, kept with `status` (the engine went away or is restarted)."""
        if self.answer is not None:
            self.answer.end(status)

    def _ask(self, continued: Message | None = None) -> None:
        """Ask for the answer to the conversation; with `continued`, carry that last answer on."""
        assert self.current is not None
        conv = self.store.conversation(self.current)
        history = [
            {"role": m.role, "content": api_content(m)}
            for m in self.store.messages(self.current)
            if m.content or m.images
        ]
        if conv.system_prompt:
            history.insert(0, {"role": "system", "content": conv.system_prompt})
        sent, dropped = history, 0
        if self.n_ctx > 0:  # else the engine's context is not known yet: it refuses what does not fit
            budget = max(MIN_PROMPT_TOKENS, self.n_ctx - self.sampling.max_tokens)
            sent, dropped = trim_to_context(history, estimate_tokens, budget)
        self.trimmed.emit(dropped)
        params = {**self.request_sampling(), **conv.settings}
        if continued is not None:
            params["continue_final_message"] = True
        message = continued if continued is not None else self.store.begin_answer(self.current)
        answer = Answer(self.store, message, self.client.stream_chat(sent, **params), self.engine, self)
        self._asked_tokens = estimate_tokens(sent) - len(answer.text) // CHARS_PER_TOKEN
        answer.grew.connect(self._answer_grew)
        answer.ended.connect(self._answer_ended)
        self.answer = answer
        self.changed.emit()
        self._answer_grew()

    def _answer_grew(self) -> None:
        if self.answer is not None:  # the count follows the answer as it is written (an estimate)
            self.context_used = self._asked_tokens + len(self.answer.text) // CHARS_PER_TOKEN
            self.context_estimated = True
            self.contextChanged.emit()
        self.answerGrew.emit()

    def _answer_ended(self, status: str, usage: dict) -> None:
        answer, self.answer = self.answer, None
        if answer is not None:
            answer.deleteLater()
        if usage.get("total_tokens"):
            self.context_used = int(usage["total_tokens"])
            self.context_estimated = False
            self.contextChanged.emit()
        else:  # stopped or cut short: the engine sent no count
            self.count_context()
        if status == "error" and answer is not None:
            self.failed.emit(answer.error)
        self.changed.emit()
        self.answerFinished.emit(status, usage)

    # --- the context count -------------------------------------------------------------------------

    def set_context_length(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.contextChanged.emit()

    def count_context(self) -> None:
        """Estimate the shown conversation's context from its text (the engine counts it after an answer)."""
        messages = self.store.messages(self.current) if self.current is not None else []
        self.context_used = sum(len(m.content) for m in messages) // CHARS_PER_TOKEN + 4 * len(messages)
        self.context_estimated = bool(messages)
        self.contextChanged.emit()
