"""A generation in the Responses API's shapes: the response object, its output items, and the stream's
events (created, in_progress, each item added/delta/done, completed/incomplete or failed)."""

from __future__ import annotations

import json
import time
from typing import Any

from app.engine.stats import SpecStats
from app.engine.tools import Parsed, ToolCall
from app.server.content import new_id
from app.server.errors import APIError
from app.server.jobs import Reply
from app.server.openai.logprobs import response_logprobs
from app.server.openai.responses import ResponsesRequest
from app.server.runner.base import Logprob, Piece


def message_item(
    item_id: str, text: str, status: str, logprobs: list[Logprob] | None = None
) -> dict[str, Any]:
    content = [] if status == "in_progress" else [text_part(text, logprobs)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def text_part(text: str, logprobs: list[Logprob] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": response_logprobs(logprobs)}


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    arguments = call.arguments if status == "completed" else ""
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def usage(stats: SpecStats) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.reused_tokens, "cache_write_tokens": 0},
        "output_tokens": stats.emitted,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.prompt_tokens + stats.emitted,
        "speculative": stats.as_dict(),  # extension, as in the other routes' usage
    }


class Shell:
    """The response object around the output: what the request asked, echoed as OpenAI does."""

    def __init__(self, body: ResponsesRequest, model: str, tools: list[dict[str, Any]]) -> None:
        self.id = new_id("resp", "_")
        self.created = int(time.time())
        self.body, self.model = body, model
        self.tools = [{"type": "function", **t["function"]} for t in tools]

    def response(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body = self.body
        text = (
            body.text.model_dump(by_alias=True, exclude_none=True)
            if body.text
            else {"format": {"type": "text"}}
        )
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": body.tool_choice,
            "tools": self.tools,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "instructions": body.instructions,
            "previous_response_id": None,
            "store": False,
            "text": text,
            "truncation": "disabled",
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **extra,
        }


def ending(finish: str | None) -> dict[str, Any]:
    if finish == "length":
        return {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    return {"status": "completed"}


def whole_response(shell: Shell, reply: Reply) -> dict[str, Any]:
    """The response of a generation not streamed: its text (or an empty message) and its calls."""
    output = []
    if reply.content or not reply.calls:
        output.append(message_item(new_id("msg", "_"), reply.content, "completed", reply.logprobs))
    output += [call_item(call) for call in reply.calls]
    end = ending(reply.finish)
    return shell.response(end.pop("status"), output, usage=usage(reply.stats), **end)


class ResponseEvents:
    """The Responses stream: numbered events; a text item opens at the first content and closes before a
    call or at the end; each call is one whole function_call item."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the text item being streamed: id, index, text, logprobs
        self.stats: SpecStats = SpecStats()
        self.finish: str | None = None

    def _event(self, kind: str, **payload: Any) -> str:
        data = json.dumps({"type": kind, "sequence_number": self.sequence, **payload}, ensure_ascii=False)
        self.sequence += 1
        return f"event: {kind}\ndata: {data}\n\n"

    def opening(self) -> list[str]:
        in_progress = self.shell.response("in_progress", [])
        return [
            self._event("response.created", response=in_progress),
            self._event("response.in_progress", response=in_progress),
        ]

    def piece(self, piece: Piece, parsed: Parsed, finish: str | None) -> list[str]:
        out = []
        if parsed.content:
            if self.message is None:
                out += self._open_message()
            m = self.message
            assert m is not None
            m["text"] += parsed.content
            m["logprobs"] += piece.logprobs or []
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=m["id"],
                    output_index=m["index"],
                    content_index=0,
                    delta=parsed.content,
                    logprobs=response_logprobs(piece.logprobs),
                )
            )
        for call in parsed.calls:
            out += self._close_message()
            out += self._call(call)
        if piece.finish_reason is not None:
            self.finish = finish
            self.stats = piece.stats or self.stats
        return out

    def failed(self, error: APIError, held: str) -> list[str]:
        if held and self.message is not None:
            self.message["text"] += held
        out = self._close_message()
        out.append(self._event("error", code=error.code, message=error.message, param=error.param))
        failure = {"code": error.code, "message": error.message}
        failed = self.shell.response("failed", self.output, error=failure)
        return [*out, self._event("response.failed", response=failed)]

    def closing(self) -> list[str]:
        out = self._open_message() if not self.output else []  # an empty answer is still one (empty) message
        out += self._close_message()
        end = ending(self.finish)
        status = end.pop("status")
        done = self.shell.response(status, self.output, usage=usage(self.stats), **end)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self._event(kind, response=done)]

    def _open_message(self) -> list[str]:
        m = self.message = {"id": new_id("msg", "_"), "index": len(self.output), "text": "", "logprobs": []}
        self.output.append({})
        where = {"item_id": m["id"], "output_index": m["index"]}
        item = message_item(m["id"], "", "in_progress")
        return [
            self._event("response.output_item.added", output_index=m["index"], item=item),
            self._event("response.content_part.added", **where, content_index=0, part=text_part("")),
        ]

    def _close_message(self) -> list[str]:
        if self.message is None:
            return []
        m, self.message = self.message, None
        where = {"item_id": m["id"], "output_index": m["index"], "content_index": 0}
        item = message_item(m["id"], m["text"], "completed", m["logprobs"])
        self.output[m["index"]] = item
        logprobs = response_logprobs(m["logprobs"])
        return [
            self._event("response.output_text.done", **where, text=m["text"], logprobs=logprobs),
            self._event("response.content_part.done", **where, part=item["content"][0]),
            self._event("response.output_item.done", output_index=m["index"], item=item),
        ]

    def _call(self, call: ToolCall) -> list[str]:
        index, item = len(self.output), call_item(call)
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": index}
        return [
            self._event(
                "response.output_item.added", output_index=index, item=call_item(call, "in_progress")
            ),
            self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
            self._event(
                "response.function_call_arguments.done", **where, arguments=call.arguments, name=call.name
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
