"""A generation in OpenAI's chat and text completion shapes: whole replies, and streams' events."""

from __future__ import annotations

import time
from typing import Any

from app.engine.stats import SpecStats
from app.engine.tools import Parsed
from app.server.errors import APIError, error_event
from app.server.jobs import Reply
from app.server.openai.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    ResponseMessage,
    ToolCallDelta,
    ToolCallOut,
    Usage,
    sse,
)
from app.server.runner.base import Piece


def chat_completion(rid: str, model: str, reply: Reply) -> ChatCompletion:
    calls = [ToolCallOut.of(call) for call in reply.calls] or None
    content = reply.content if reply.content or calls is None else None
    choice = ChatChoice(
        message=ResponseMessage(content=content, tool_calls=calls),
        finish_reason=reply.finish,
        logprobs=ChoiceLogprobs.of(reply.logprobs),
    )
    return ChatCompletion(id=rid, model=model, choices=[choice], usage=Usage.from_stats(reply.stats))


def completion(rid: str, model: str, reply: Reply, with_top: bool) -> Completion:
    logprobs = CompletionLogprobs.of(reply.logprobs, with_top)
    choice = CompletionChoice(text=reply.content, finish_reason=reply.finish, logprobs=logprobs)
    return Completion(id=rid, model=model, choices=[choice], usage=Usage.from_stats(reply.stats))


class ChatEvents:
    """chat.completion.chunk events: the role, content deltas, each tool call as OpenAI streams one (its
    name, then its arguments), the finish reason; the usage chunk where asked; [DONE]."""

    def __init__(self, rid: str, model: str, include_usage: bool) -> None:
        self.rid, self.model, self.include_usage = rid, model, include_usage
        self.created = int(time.time())
        self.stats: SpecStats | None = None

    def _chunk(self, choices: list[ChatChunkChoice], **extra: Any) -> str:
        return sse(
            ChatCompletionChunk(id=self.rid, created=self.created, model=self.model, choices=choices, **extra)
        )

    def opening(self) -> list[str]:
        return [self._chunk([ChatChunkChoice(delta=Delta(role="assistant", content=""))])]

    def piece(self, piece: Piece, parsed: Parsed, finish: str | None) -> list[str]:
        out = []
        if parsed.content or piece.text or piece.tokens:
            choice = ChatChunkChoice(
                delta=Delta(content=parsed.content), logprobs=ChoiceLogprobs.of(piece.logprobs)
            )
            out.append(self._chunk([choice], speculative_tokens=piece.from_draft))
        for call in parsed.calls:
            out.append(self._chunk([ChatChunkChoice(delta=Delta(tool_calls=[ToolCallDelta.opening(call)]))]))
            out.append(
                self._chunk([ChatChunkChoice(delta=Delta(tool_calls=[ToolCallDelta.arguments(call)]))])
            )
        if piece.finish_reason is not None:
            out.append(self._chunk([ChatChunkChoice(delta=Delta(), finish_reason=finish)]))
            self.stats = piece.stats
        return out

    def failed(self, error: APIError, held: str) -> list[str]:
        out = [self._chunk([ChatChunkChoice(delta=Delta(content=held))])] if held else []
        return [*out, error_event(error), *self.closing()]

    def closing(self) -> list[str]:
        usage = (
            [self._chunk([], usage=Usage.from_stats(self.stats))]
            if self.include_usage and self.stats is not None
            else []
        )
        return [*usage, sse("[DONE]")]


class CompletionEvents:
    """text_completion events: each piece's text (its logprobs' offsets), the usage where asked, [DONE]."""

    def __init__(self, rid: str, model: str, include_usage: bool, with_top: bool) -> None:
        self.rid, self.model = rid, model
        self.include_usage, self.with_top = include_usage, with_top
        self.created = int(time.time())
        self.stats: SpecStats | None = None
        self.offset = 0

    def _completion(self, choices: list[CompletionChoice], **extra: Any) -> str:
        return sse(Completion(id=self.rid, created=self.created, model=self.model, choices=choices, **extra))

    def opening(self) -> list[str]:
        return []

    def piece(self, piece: Piece, parsed: Parsed, finish: str | None) -> list[str]:
        logprobs = CompletionLogprobs.of(piece.logprobs, self.with_top, self.offset)
        self.offset += len(piece.text)
        choice = CompletionChoice(text=piece.text, finish_reason=piece.finish_reason, logprobs=logprobs)
        self.stats = piece.stats or self.stats
        return [self._completion([choice], speculative_tokens=piece.from_draft)]

    def failed(self, error: APIError, held: str) -> list[str]:
        return [error_event(error), *self.closing()]

    def closing(self) -> list[str]:
        usage = self.include_usage and self.stats is not None
        return [*([self._completion([], usage=Usage.from_stats(self.stats))] if usage else []), sse("[DONE]")]
