"""The engine's FastAPI app: OpenAI's chat and text completions, the model list, health, props, metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from app.config import Settings
from app.engine.chat import CONTINUE_PARAM, continued
from app.engine.errors import EngineError
from app.server import admission, anthropic, responses
from app.server.errors import APIError, error_event, render_error, stream_error
from app.server.fields import accepted_ignored, parse_request
from app.server.guards import Guard
from app.server.hosts import allowed_hosts, is_loopback, machine_names
from app.server.jobs import (
    admission_headers,
    chat_body_limit,
    collect,
    event_stream,
    held_text,
    make_job,
    model_id,
    not_loaded,
    parsed_pieces,
    read_body,
    refuse_images,
    reply_finish,
    start,
)
from app.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    Delta,
    ModelCard,
    ModelList,
    ResponseMessage,
    ToolCallDelta,
    ToolCallOut,
    Usage,
    chat_messages,
    new_id,
    sse,
)
from app.server.state import AppState, app_state
from app.server.worker import Worker

__all__ = ["AppState", "create_app", "event_stream", "model_id", "read_body"]  # admin.py's names from here
router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(ChatCompletionRequest, await read_body(request, chat_body_limit(state)))
    messages = chat_messages(body.messages)
    refuse_images(messages, state.worker.props)
    continuation = ""
    if body.continue_final_message:  # the window's Continue: the answer it sends is carried on
        if state.public:
            raise APIError(400, f"unsupported field: {CONTINUE_PARAM}", "unsupported_field", CONTINUE_PARAM)
        messages, continuation = continued(messages)
    response_grammar = body.response_format.grammar() if body.response_format else None
    submission = make_job(
        state,
        body.sampling(),
        messages=messages,
        tools=body.tool_dicts,
        tool_choice=body.tool_choice,
        response_grammar=response_grammar,
        logprobs=body.logprobs_top,
        speculative=body.speculative,
    )
    if continuation:
        if submission.job.prefill:
            message = f"{CONTINUE_PARAM}: an answer cannot be continued with a forced tool call"
            raise APIError(400, message, "invalid_request_error", CONTINUE_PARAM)
        submission.job.prefill = continuation
    first = await start(state, submission.job, streamed=body.stream)
    rid, model = new_id("chatcmpl"), model_id(state)
    if not body.stream:
        reply = await collect(request, submission, first)
        calls = [ToolCallOut.of(call) for call in reply.calls] or None
        content = reply.content if reply.content or calls is None else None
        choice = ChatChoice(
            message=ResponseMessage(content=content, tool_calls=calls),
            finish_reason=reply.finish,
            logprobs=ChoiceLogprobs.of(reply.logprobs),
        )
        usage = Usage.from_stats(reply.stats)
        completion = ChatCompletion(id=rid, model=model, choices=[choice], usage=usage)
        return JSONResponse(completion.model_dump(), headers=admission_headers(submission.job))

    async def events() -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(choices: list[ChatChunkChoice], **extra: Any) -> str:
            return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices, **extra))

        yield chunk([ChatChunkChoice(delta=Delta(role="assistant", content=""))])
        stats = None
        try:
            async for piece, parsed in parsed_pieces(submission, first):
                if parsed.content or piece.text or piece.tokens:
                    choice = ChatChunkChoice(
                        delta=Delta(content=parsed.content), logprobs=ChoiceLogprobs.of(piece.logprobs)
                    )
                    yield chunk([choice], speculative_tokens=piece.from_draft)
                for call in parsed.calls:  # as OpenAI streams a call: its name first, then its arguments
                    yield chunk([ChatChunkChoice(delta=Delta(tool_calls=[ToolCallDelta.opening(call)]))])
                    yield chunk([ChatChunkChoice(delta=Delta(tool_calls=[ToolCallDelta.arguments(call)]))])
                if piece.finish_reason is not None:
                    finish = reply_finish(submission, piece.finish_reason)
                    yield chunk([ChatChunkChoice(delta=Delta(), finish_reason=finish)])
                    stats = piece.stats
        except Exception as exc:
            held = held_text(submission)
            if held:
                yield chunk([ChatChunkChoice(delta=Delta(content=held))])
            yield error_event(stream_error(exc))
        if body.include_usage and stats is not None:
            yield chunk([], usage=Usage.from_stats(stats))
        yield sse("[DONE]")

    return event_stream(events(), admission_headers(submission.job))


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = app_state(request)
    body = parse_request(CompletionRequest, await read_body(request))
    submission = make_job(
        state,
        body.sampling(),
        text=body.prompt,
        suffix=body.suffix,
        logprobs=body.logprobs,
        speculative=body.speculative,
    )
    first = await start(state, submission.job, streamed=body.stream)
    rid, model = new_id("cmpl"), model_id(state)
    with_top = bool(body.logprobs)
    if not body.stream:
        reply = await collect(request, submission, first)
        logprobs = CompletionLogprobs.of(reply.logprobs, with_top)
        choice = CompletionChoice(text=reply.content, finish_reason=reply.finish, logprobs=logprobs)
        usage = Usage.from_stats(reply.stats)
        completion = Completion(id=rid, model=model, choices=[choice], usage=usage)
        return JSONResponse(
            completion.model_dump(exclude_none=True), headers=admission_headers(submission.job)
        )

    async def events() -> AsyncIterator[str]:
        created = int(time.time())
        stats, offset = None, 0
        try:
            async for piece, _ in parsed_pieces(submission, first):
                logprobs = CompletionLogprobs.of(piece.logprobs, with_top, offset)
                offset += len(piece.text)
                choice = CompletionChoice(
                    text=piece.text, finish_reason=piece.finish_reason, logprobs=logprobs
                )
                yield sse(
                    Completion(
                        id=rid,
                        created=created,
                        model=model,
                        choices=[choice],
                        speculative_tokens=piece.from_draft,
                    )
                )
                stats = piece.stats or stats
        except Exception as exc:
            yield error_event(stream_error(exc))
        if body.include_usage and stats is not None:
            yield sse(
                Completion(id=rid, created=created, model=model, choices=[], usage=Usage.from_stats(stats))
            )
        yield sse("[DONE]")

    return event_stream(events(), admission_headers(submission.job))


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


@router.api_route("/", methods=["GET", "HEAD"])
async def root(request: Request) -> Response:
    """Clients probe the base address before they start (Claude Code sends HEAD /)."""
    return JSONResponse({"name": "Foresight engine", "status": app_state(request).worker.state})


@router.get("/health")
async def health(request: Request) -> Response:
    state = app_state(request)
    worker = state.worker
    status = {"ready": "ok"}.get(worker.state, worker.state)
    body: dict[str, Any] = {"status": status}
    if worker.load_error is not None and not state.public and state.loopback:  # it names local paths
        body["message"] = str(worker.load_error)
    return JSONResponse(body, 200 if status == "ok" else 503)


def without_paths(props: dict[str, Any]) -> dict[str, Any]:
    """/props for a listener other machines can reach: file names instead of local paths."""
    out = dict(props)
    for section in ("target", "draft", "projector"):
        part = out.get(section)
        if isinstance(part, dict) and isinstance(part.get("path"), str):
            out[section] = {**part, "path": part["path"].replace("\\", "/").rsplit("/", 1)[-1]}
    return out


@router.get("/props")
async def props(request: Request) -> Response:
    state = app_state(request)
    if state.worker.props is None:
        raise not_loaded(state.worker.state)
    server = state.settings.server.model_dump()
    server.update(auth=state.api_key is not None, queue_depth=state.worker.queue_depth)
    if state.port is not None:
        server["port"] = state.port
    body = state.worker.props if state.loopback else without_paths(state.worker.props)
    return JSONResponse({**body, "server": server, "accepted_ignored": accepted_ignored()})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = app_state(request)
    worker = state.worker
    text = worker.metrics.prometheus(worker.queue_depth) + state.admission.prometheus()
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


# --- the app ----------------------------------------------------------------------------------------
def create_app(
    worker: Worker,
    settings: Settings,
    api_key: str | None = None,
    port: int | None = None,
    *,
    host: str | None = None,
    admin_token: str | None = None,
    public: bool = False,
) -> FastAPI:
    """One listener's app over the shared worker; `host` is its bind address (default: settings')."""
    server = settings.server
    host = server.host if host is None else host
    lan = machine_names() if api_key and not is_loopback(host) else ()
    allowed = allowed_hosts(host, bool(api_key), lan)
    state = AppState(
        worker,
        admission.for_worker(worker, server.queue_size, server.per_client),
        settings,
        api_key,
        allowed,
        port,
        admin_token=admin_token,
        public=public,
        loopback=is_loopback(host),
    )
    app = FastAPI(title="Foresight engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.foresight = state
    app.include_router(router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    for kind in (APIError, EngineError, HTTPException, Exception):
        app.add_exception_handler(kind, render_error)
    app.add_middleware(Guard, state=state)
    if server.cors_origin:  # outermost, so that preflight requests are answered before the key check
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[server.cors_origin],
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        )
    return app
