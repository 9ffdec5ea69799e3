"""Anthropic's routes: /v1/messages and its token count. Each parses its request, queues the job and
answers in Anthropic's shapes (replies.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from app.server.anthropic.replies import MessageEvents, message
from app.server.content import new_id, refuse_images
from app.server.fields import dropped_tools, parse_request
from app.server.jobs import (
    Sampling,
    Submission,
    chat_body_limit,
    collect,
    count_prompt,
    event_stream,
    make_job,
    model_id,
    read_body,
    start,
    stream_events,
)
from app.server.state import app_state

router = APIRouter()


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
    tokens = await count_prompt(state, submission.job)
    return JSONResponse({"input_tokens": tokens}, headers=dropped_tools(dropped))


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
    first = await start(state, submission.job, streamed=body.stream)
    rid, model = new_id("msg", "_"), model_id(state)
    if not body.stream:
        reply = await collect(request, submission, first)
        return JSONResponse(message(rid, model, reply), headers=dropped_tools(dropped))
    events = MessageEvents(rid, model, submission.job.prompt_tokens or 0)
    return event_stream(stream_events(submission, first, events), dropped_tools(dropped))
