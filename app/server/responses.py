"""OpenAI's Responses API (Codex, the openai package's client.responses): /v1/responses, nothing kept."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from app.engine import grammar
from app.engine.stats import SpecStats
from app.engine.tools import ToolCall
from app.server.errors import APIError, stream_error
from app.server.fields import RESPONSES_IGNORED, Strict, parse_request
from app.server.jobs import (
    Sampling,
    chat_body_limit,
    collect,
    event_stream,
    held_text,
    make_job,
    model_id,
    parsed_pieces,
    read_body,
    refuse_images,
    reply_finish,
    start,
)
from app.server.logprobs import response_logprobs
from app.server.protocol import MAX_TOP_LOGPROBS, check_parts, new_id
from app.server.state import app_state
from app.server.worker import Logprob

log = logging.getLogger("foresight.server")
router = APIRouter()
DROPPED_HEADER = "x-foresight-dropped-tools"
SKIPPED_ITEMS = ("reasoning",)  # a model that does not reason never sends these out, so nothing is lost
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _refuse(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_request_error", param)


class TextFormat(Strict):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the grammar follows the schema either way


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: str | None = None  # asks reasoning models for shorter or longer answers; none is served

    ignored = frozenset({"verbosity"})


class ResponsesRequest(Strict):
    ignored = RESPONSES_IGNORED

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # extension
    max_output_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    stream: bool = False
    text: TextConfig | None = None
    truncation: Literal["disabled"] | None = (
        None  # "auto" would drop input to fit: a prompt too long is refused
    )
    background: Literal[False] | None = None
    previous_response_id: str | None = None
    speculative: bool = True  # extension, as on the other routes

    @field_validator("previous_response_id")
    @classmethod
    def _nothing_kept(cls, previous: str | None) -> None:
        if previous is not None:
            raise PydanticCustomError(
                "previous_response_id", "no response is kept here to continue from: send the whole input"
            )
        return None

    def sampling(self) -> Sampling:
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_output_tokens,
        )

    def response_grammar(self) -> grammar.Grammar | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return grammar.json_object("text.format")
        if fmt.json_schema is None:
            raise _refuse("text.format.schema", "a json_schema format needs its schema")
        return grammar.json_schema(fmt.json_schema, "text.format.schema")

    def openai_tools(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Function tools as chat tools; other tool types (local_shell, web_search, ...) dropped, named."""
        tools, dropped = [], []
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") != "function":
                dropped.append(str(tool.get("name") or tool.get("type")))
                continue
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise _refuse(f"tools[{i}].name", "a function tool needs a name")
            function = {
                k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
            }
            tools.append({"type": "function", "function": function})
        if dropped:
            log.info("responses: tools dropped (not function tools): %s", ", ".join(dropped))
        return tools, dropped

    def openai_tool_choice(self, names: list[str]) -> str | dict[str, Any]:
        choice = self.tool_choice
        if choice in ("auto", "none"):
            return choice
        if not names:
            raise _refuse("tool_choice", "a call is required but no function tools are given")
        if choice == "required":
            return "required"
        if isinstance(choice, dict) and choice.get("type") == "function":
            if choice.get("name") not in names:
                raise _refuse("tool_choice.name", f"function {choice.get('name')!r} is not among the tools")
            return {"type": "function", "function": {"name": choice["name"]}}
        raise _refuse(
            "tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...}'
        )


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content or []):
        if part.get("type") not in TEXT_PARTS:
            raise _refuse(f"{param}[{j}]", f"{part.get('type')!r} parts are not read here")
        texts.append(str(part.get("text", part.get("refusal", ""))))
    return "".join(texts)


def _user_content(content: Any, param: str) -> Any:
    if isinstance(content, str):
        return content
    check_parts(content, param)
    parts = []
    for part in content:
        if part["type"] == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url", "")}})
        else:
            parts.append({"type": "text", "text": str(part.get("text", ""))})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def chat_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """instructions and input items as chat messages: function_call items join the assistant's turn,
    function_call_output items become role "tool" messages (each must answer a call before it)."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}]
    calls: set[str] = set()
    for i, item in enumerate(body.input):
        kind, where = item.get("type", "message"), f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _refuse(f"{where}.role", f"{role!r} is not a role (user, assistant, system, developer)")
            if role == "assistant":
                out.append({"role": "assistant", "content": _text(item.get("content"), f"{where}.content")})
            elif role in ("system", "developer"):
                out.append({"role": "system", "content": _text(item.get("content"), f"{where}.content")})
            else:
                out.append(
                    {"role": "user", "content": _user_content(item.get("content"), f"{where}.content")}
                )
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise _refuse(where, "a function_call item needs a call_id and a name")
            calls.add(call_id)
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": item.get("arguments", "{}")},
            }
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in calls:
                raise _refuse(
                    f"{where}.call_id", f"no function_call with call_id {call_id!r} comes before it"
                )
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": _text(item.get("output"), f"{where}.output"),
                }
            )
        elif kind not in SKIPPED_ITEMS:
            raise _refuse(f"{where}.type", f"{kind!r} items are not supported")
    return out


# --- output -----------------------------------------------------------------------------------------
def _message_item(
    item_id: str, text: str, status: str, logprobs: list[Logprob] | None = None
) -> dict[str, Any]:
    content = [] if status == "in_progress" else [_text_part(text, logprobs)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _text_part(text: str, logprobs: list[Logprob] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": response_logprobs(logprobs)}


def _call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    arguments = call.arguments if status == "completed" else ""
    return {
        "type": "function_call",
        "id": "fc_" + call.id.removeprefix("call_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _usage(stats: SpecStats) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.reused_tokens, "cache_write_tokens": 0},
        "output_tokens": stats.emitted,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.prompt_tokens + stats.emitted,
        "speculative": stats.as_dict(),  # extension, as in the other routes' usage
    }


class _Shell:
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


def _ending(finish: str | None) -> dict[str, Any]:
    if finish == "length":
        return {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    return {"status": "completed"}


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(ResponsesRequest, await read_body(request, chat_body_limit(state)))
    tools, dropped = body.openai_tools()
    messages = chat_messages(body)
    refuse_images(messages, state.worker.props)
    submission = make_job(
        state,
        body.sampling(),
        messages=messages,
        tools=tools,
        tool_choice=body.openai_tool_choice([t["function"]["name"] for t in tools]),
        response_grammar=body.response_grammar(),
        logprobs=body.top_logprobs,
        speculative=body.speculative,
    )
    headers = {DROPPED_HEADER: ", ".join(dropped)} if dropped else None
    first = await start(state, submission.job, streamed=body.stream)
    shell = _Shell(body, model_id(state), tools)
    if not body.stream:
        reply = await collect(request, submission, first)
        output = []
        if reply.content or not reply.calls:
            output.append(_message_item(new_id("msg", "_"), reply.content, "completed", reply.logprobs))
        output += [_call_item(call) for call in reply.calls]
        ending = _ending(reply.finish)
        response = shell.response(ending.pop("status"), output, usage=_usage(reply.stats), **ending)
        return JSONResponse(response, headers=headers)

    async def events() -> AsyncIterator[str]:
        sequence = 0

        def event(kind: str, **payload: Any) -> str:
            nonlocal sequence
            data = json.dumps({"type": kind, "sequence_number": sequence, **payload}, ensure_ascii=False)
            sequence += 1
            return f"event: {kind}\ndata: {data}\n\n"

        output: list[dict[str, Any]] = []
        message: dict[str, Any] | None = None  # the text item being streamed: id, index, text, logprobs
        yield event("response.created", response=shell.response("in_progress", []))
        yield event("response.in_progress", response=shell.response("in_progress", []))

        def open_message() -> list[str]:
            nonlocal message
            message = {"id": new_id("msg", "_"), "index": len(output), "text": "", "logprobs": []}
            output.append({})
            where = {"item_id": message["id"], "output_index": message["index"]}
            return [
                event(
                    "response.output_item.added",
                    output_index=message["index"],
                    item=_message_item(message["id"], "", "in_progress"),
                ),
                event("response.content_part.added", **where, content_index=0, part=_text_part("")),
            ]

        def close_message() -> list[str]:
            nonlocal message
            if message is None:
                return []
            m, message = message, None
            where = {"item_id": m["id"], "output_index": m["index"], "content_index": 0}
            item = _message_item(m["id"], m["text"], "completed", m["logprobs"])
            output[m["index"]] = item
            return [
                event(
                    "response.output_text.done",
                    **where,
                    text=m["text"],
                    logprobs=response_logprobs(m["logprobs"]),
                ),
                event("response.content_part.done", **where, part=item["content"][0]),
                event("response.output_item.done", output_index=m["index"], item=item),
            ]

        stats, finish = SpecStats(), None
        try:
            async for piece, parsed in parsed_pieces(submission, first):
                if parsed.content:
                    for line in [] if message is not None else open_message():
                        yield line
                    assert message is not None
                    message["text"] += parsed.content
                    message["logprobs"] += piece.logprobs or []
                    yield event(
                        "response.output_text.delta",
                        item_id=message["id"],
                        output_index=message["index"],
                        content_index=0,
                        delta=parsed.content,
                        logprobs=response_logprobs(piece.logprobs),
                    )
                for call in parsed.calls:
                    for line in close_message():
                        yield line
                    index, item = len(output), _call_item(call)
                    output.append(item)
                    where = {"item_id": item["id"], "output_index": index}
                    yield event(
                        "response.output_item.added", output_index=index, item=_call_item(call, "in_progress")
                    )
                    yield event("response.function_call_arguments.delta", **where, delta=call.arguments)
                    yield event(
                        "response.function_call_arguments.done",
                        **where,
                        arguments=call.arguments,
                        name=call.name,
                    )
                    yield event("response.output_item.done", output_index=index, item=item)
                if piece.finish_reason is not None:
                    finish = reply_finish(submission, piece.finish_reason)
                    stats = piece.stats or stats
        except Exception as exc:
            error = stream_error(exc)
            held = held_text(submission)
            if held and message is not None:
                message["text"] += held
            for line in close_message():
                yield line
            yield event("error", code=error.code, message=error.message, param=error.param)
            failure = {"code": error.code, "message": error.message}
            yield event("response.failed", response=shell.response("failed", output, error=failure))
            return
        if not output:  # an empty answer is still one (empty) message, as in the whole response
            for line in open_message():
                yield line
        for line in close_message():
            yield line
        ending = _ending(finish)
        status = ending.pop("status")
        done = shell.response(status, output, usage=_usage(stats), **ending)
        yield event("response.completed" if status == "completed" else "response.incomplete", response=done)

    return event_stream(events(), headers)
