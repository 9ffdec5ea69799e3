"""OpenAI's routes: chat and text completions, Responses, the model list. Each parses its request, queues
the job and answers in its shapes (replies.py, response_events.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.engine.chat import CONTINUE_PARAM, continued
from app.server.content import new_id, refuse_images
from app.server.errors import APIError
from app.server.fields import dropped_tools, parse_request
from app.server.jobs import (
    Submission,
    admission_headers,
    chat_body_limit,
    collect,
    event_stream,
    make_job,
    model_id,
    not_loaded,
    read_body,
    start,
    stream_events,
)
from app.server.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    chat_messages,
)
from app.server.openai.replies import ChatEvents, CompletionEvents, chat_completion, completion
from app.server.openai.response_events import ResponseEvents, Shell, whole_response
from app.server.openai.responses import ResponsesRequest
from app.server.openai.responses import chat_messages as response_messages
from app.server.state import AppState, app_state

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(ChatCompletionRequest, await read_body(request, chat_body_limit(state)))
    submission = chat_submission(state, body)
    first = await start(state, submission.job, streamed=body.stream)
    rid, model, headers = new_id("chatcmpl"), model_id(state), admission_headers(submission.job)
    if not body.stream:
        reply = await collect(request, submission, first)
        return JSONResponse(chat_completion(rid, model, reply).model_dump(), headers=headers)
    events = ChatEvents(rid, model, body.include_usage)
    return event_stream(stream_events(submission, first, events), headers)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(CompletionRequest, await read_body(request))
    sampling = body.sampling()
    submission = make_job(
        state,
        sampling,
        text=body.prompt,
        suffix=body.suffix,
        logprobs=body.logprobs,
        speculative=body.speculative,
    )
    first = await start(state, submission.job, streamed=body.stream)
    rid, model, headers = new_id("cmpl"), model_id(state), admission_headers(submission.job)
    with_top = bool(body.logprobs)
    if not body.stream:
        reply = await collect(request, submission, first)
        return JSONResponse(
            completion(rid, model, reply, with_top).model_dump(exclude_none=True), headers=headers
        )
    events = CompletionEvents(rid, model, body.include_usage, with_top)
    return event_stream(stream_events(submission, first, events), headers)


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(ResponsesRequest, await read_body(request, chat_body_limit(state)))
    tools, dropped = body.openai_tools()
    messages = response_messages(body)
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
    first = await start(state, submission.job, streamed=body.stream)
    shell = Shell(body, model_id(state), tools)
    if not body.stream:
        reply = await collect(request, submission, first)
        return JSONResponse(whole_response(shell, reply), headers=dropped_tools(dropped))
    return event_stream(stream_events(submission, first, ResponseEvents(shell)), dropped_tools(dropped))


def chat_submission(state: AppState, body: ChatCompletionRequest) -> Submission:
    """The chat request's job: its messages (images refused where the model has no vision), tools, response
    format; the window's Continue carries on the answer it sends (private listener only)."""
    messages = chat_messages(body.messages)
    refuse_images(messages, state.worker.props)
    continuation = ""
    if body.continue_final_message:
        if state.public:
            raise APIError(400, f"unsupported field: {CONTINUE_PARAM}", "unsupported_field", CONTINUE_PARAM)
        messages, continuation = continued(messages)
    submission = make_job(
        state,
        body.sampling(),
        messages=messages,
        tools=body.tool_dicts,
        tool_choice=body.tool_choice,
        response_grammar=body.response_format.grammar() if body.response_format else None,
        logprobs=body.logprobs_top,
        speculative=body.speculative,
    )
    if continuation:
        if submission.job.prefill:
            message = f"{CONTINUE_PARAM}: an answer cannot be continued with a forced tool call"
            raise APIError(400, message, "invalid_request_error", CONTINUE_PARAM)
        submission.job.prefill = continuation
    return submission


def _model_card(state: AppState) -> ModelCard:
    props = state.worker.props
    if props is None:
        raise not_loaded(state.worker.state)
    return ModelCard(
        id=model_id(state),
        created=state.started,
        context_length=props["target"]["n_ctx"],
        draft=props["draft"]["source"],
    )


@router.get("/v1/models")
async def models(request: Request) -> Response:
    return JSONResponse(ModelList(data=[_model_card(app_state(request))]).model_dump())


@router.get("/v1/models/{model:path}")
async def model(request: Request, model: str) -> Response:
    """The loaded model by its id (any id names it: one model is served, whatever a request calls it)."""
    card = _model_card(app_state(request))
    return JSONResponse(card.model_copy(update={"id": model or card.id}).model_dump())
