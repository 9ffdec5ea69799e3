"""A generation in Anthropic's Messages shapes: the whole message, and the stream's events (message_start,
content blocks, message_delta with the stop reason and usage, message_stop)."""

from __future__ import annotations

import json
from typing import Any

from app.engine.tools import Parsed, ToolCall
from app.server.errors import APIError, as_api_error
from app.server.jobs import Reply
from app.server.runner.base import Piece


def stop_reason(finish: str | None, stop_sequence: str | None) -> str:
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": anthropic_call_id(call), "name": call.name, "input": arguments}


def anthropic_call_id(call: ToolCall) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def usage(input_tokens: int, output_tokens: int, speculative: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    if speculative is not None:
        out["speculative"] = speculative  # extension, as in the OpenAI routes' usage
    return out


def message(rid: str, model: str, reply: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.content}] if reply.content else []
    content += [tool_use(call) for call in reply.calls]
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(reply.finish, reply.stop_sequence),
        "stop_sequence": reply.stop_sequence,
        "usage": usage(reply.prompt_tokens, reply.stats.emitted, reply.stats.as_dict()),
    }


def _event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


class MessageEvents:
    """message_start, ping, content blocks (text deltas; a tool_use's input as one input_json_delta),
    message_delta with the stop reason and usage, message_stop."""

    def __init__(self, rid: str, model: str, prompt_tokens: int) -> None:
        self.rid, self.model, self.prompt_tokens = rid, model, prompt_tokens
        self.index, self.text_open = 0, False
        self.finish: str | None = None
        self.stop: str | None = None
        self.emitted = 0
        self.speculative: dict[str, Any] | None = None

    def opening(self) -> list[str]:
        start = {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(self.prompt_tokens, 0),
        }
        return [_event("message_start", {"message": start}), _event("ping", {})]

    def piece(self, piece: Piece, parsed: Parsed, finish: str | None) -> list[str]:
        out = self._text(parsed.content) if parsed.content else []
        for call in parsed.calls:
            out += self._close_text()
            block = {**tool_use(call), "input": {}}
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            out += [
                _event("content_block_start", {"index": self.index, "content_block": block}),
                _event("content_block_delta", {"index": self.index, "delta": delta}),
                _event("content_block_stop", {"index": self.index}),
            ]
            self.index += 1
        if piece.finish_reason is not None:
            self.finish, self.stop = finish, piece.stop_sequence
            if piece.stats is not None:
                self.emitted, self.speculative = piece.stats.emitted, piece.stats.as_dict()
        return out

    def failed(self, error: APIError, held: str) -> list[str]:
        out = self._text(held) if held else []
        if self.text_open:
            out.append(_event("content_block_stop", {"index": self.index}))
        return [*out, _event("error", {"error": as_api_error(error).anthropic_body()["error"]})]

    def closing(self) -> list[str]:
        out = [_event("content_block_stop", {"index": self.index})] if self.text_open else []
        delta = {"stop_reason": stop_reason(self.finish, self.stop), "stop_sequence": self.stop}
        end_usage = usage(self.prompt_tokens, self.emitted, self.speculative)
        return [
            *out,
            _event("message_delta", {"delta": delta, "usage": end_usage}),
            _event("message_stop", {}),
        ]

    def _text(self, text: str) -> list[str]:
        out = []
        if not self.text_open:
            block = {"type": "text", "text": ""}
            out.append(_event("content_block_start", {"index": self.index, "content_block": block}))
            self.text_open = True
        out.append(
            _event(
                "content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": text}}
            )
        )
        return out

    def _close_text(self) -> list[str]:
        if not self.text_open:
            return []
        out = [_event("content_block_stop", {"index": self.index})]
        self.index, self.text_open = self.index + 1, False
        return out
