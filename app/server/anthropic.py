"""Anthropic's Messages API (Claude Code and the anthropic package): /v1/messages and its token count."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.engine.tools import ToolCall
from app.server.errors import as_api_error, stream_error
from app.server.fields import parse_request
from app.server.jobs import (
    Reply,
    Sampling,
    Submission,
    chat_body_limit,
    collect,
    count_prompt,
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
from app.server.messages import CountTokensRequest, MessagesRequest
from app.server.protocol import new_id
from app.server.state import app_state

router = APIRouter()
DROPPED_HEADER = "x-foresight-dropped-tools"


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


def _submission(request: Request, body: CountTokensRequest, **job: Any) -> tuple[Submission, list[str]]:
    state = app_state(request)
    messages, tools, dropped = body.chat()
    refuse_images(messages, state.worker.props)
    choice = body.openai_tool_choice()
    submission = make_job(
        state, job.pop("sampling"), messages=messages, tools=tools, tool_choice=choice, **job
    )
    return submission, dropped


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(CountTokensRequest, await read_body(request, chat_body_limit(state)))
    submission, dropped = _submission(request, body, sampling=Sampling(), count_only=True)
    headers = {DROPPED_HEADER: ", ".join(dropped)} if dropped else None
    return JSONResponse({"input_tokens": await count_prompt(state, submission.job)}, headers=headers)


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(MessagesRequest, await read_body(request, chat_body_limit(state)))
    submission, dropped = _submission(
        request,
        body,
        sampling=body.sampling(),
        response_grammar=body.response_grammar(),
        speculative=body.speculative,
    )
    headers = {DROPPED_HEADER: ", ".join(dropped)} if dropped else None
    first = await start(state, submission.job, streamed=body.stream)
    rid, model = new_id("msg", "_"), model_id(state)
    if not body.stream:
        reply = await collect(request, submission, first)
        return JSONResponse(message(rid, model, reply), headers=headers)
    return event_stream(_events(submission, first, rid, model), headers)


def _event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


async def _events(submission: Submission, first: Any, rid: str, model: str) -> AsyncIterator[str]:
    """message_start, content blocks (text deltas; a tool_use's input as one input_json_delta), message_delta
    with the stop reason and usage, message_stop."""
    job = submission.job
    prompt_tokens = job.prompt_tokens or 0
    start_message = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage(prompt_tokens, 0),
    }
    yield _event("message_start", {"message": start_message})
    yield _event("ping", {})
    index, text_open = 0, False
    finish, stop, emitted, speculative = None, None, 0, None
    try:
        async for piece, parsed in parsed_pieces(submission, first):
            if parsed.content:
                if not text_open:
                    block = {"type": "text", "text": ""}
                    yield _event("content_block_start", {"index": index, "content_block": block})
                    text_open = True
                delta = {"type": "text_delta", "text": parsed.content}
                yield _event("content_block_delta", {"index": index, "delta": delta})
            for call in parsed.calls:
                if text_open:
                    yield _event("content_block_stop", {"index": index})
                    index, text_open = index + 1, False
                block = {**tool_use(call), "input": {}}
                yield _event("content_block_start", {"index": index, "content_block": block})
                delta = {"type": "input_json_delta", "partial_json": call.arguments}
                yield _event("content_block_delta", {"index": index, "delta": delta})
                yield _event("content_block_stop", {"index": index})
                index += 1
            if piece.finish_reason is not None:
                finish = reply_finish(submission, piece.finish_reason)
                stop = piece.stop_sequence
                if piece.stats is not None:
                    emitted, speculative = piece.stats.emitted, piece.stats.as_dict()
    except Exception as exc:
        held = held_text(submission)
        if held:
            if not text_open:
                yield _event(
                    "content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}
                )
                text_open = True
            yield _event(
                "content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": held}}
            )
        if text_open:
            yield _event("content_block_stop", {"index": index})
        yield _event("error", {"error": as_api_error(stream_error(exc)).anthropic_body()["error"]})
        return
    if text_open:
        yield _event("content_block_stop", {"index": index})
    delta = {"stop_reason": stop_reason(finish, stop), "stop_sequence": stop}
    yield _event("message_delta", {"delta": delta, "usage": usage(prompt_tokens, emitted, speculative)})
    yield _event("message_stop", {})
