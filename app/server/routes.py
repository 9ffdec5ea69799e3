"""The engine's FastAPI app: thin OpenAI-compatible routes over the worker, guards, one error renderer."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from app.config import Settings
from app.engine.errors import EngineError
from app.engine.generation import Chunk
from app.engine.stats import SpecStats
from app.engine.tools import ToolCallParser, finish_reason, forced_prefill
from app.server.hosts import allowed_hosts, host_name, is_loopback, machine_names
from app.server.protocol import (
    MAX_BODY_BYTES,
    APIError,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ModelCard,
    ModelList,
    ResponseMessage,
    SamplingRequest,
    ToolCallDelta,
    ToolCallOut,
    Usage,
    error_event,
    from_engine_error,
    new_id,
    parse_body,
    sse,
)
from app.server.worker import END, Job, NotReady, QueueFull, ShuttingDown, Worker

log = logging.getLogger("foresight.server")

DRAIN_LIMIT = 16 * MAX_BODY_BYTES  # read (and drop) this much of an oversized body so the client sees 413
router = APIRouter()


@dataclass
class AppState:
    """Everything the routes share: the worker, the settings and what the guards check."""

    worker: Worker
    settings: Settings
    api_key: str | None
    allowed_hosts: frozenset[str]  # Host header names (without port) this listener answers to
    port: int | None = None  # the bound port (settings may say 0)
    admin_token: str | None = None  # the GUI's per-launch token: /admin routes, and a key for every route
    public: bool = False  # the public listener: no /admin, no /props
    closing: bool = False  # new requests get 503 while the listener shuts down
    jobs: weakref.WeakSet[Job] = field(default_factory=weakref.WeakSet)  # cancelled when it closes
    started: int = field(default_factory=lambda: int(time.time()))


def _state(request: Request) -> AppState:
    return request.app.state.foresight


# --- guards -----------------------------------------------------------------------------------------
ADMIN_DISABLED = "admin routes are disabled: start the engine with FORESIGHT_ADMIN_TOKEN set or --token-stdin"
PRIVATE_ONLY = ("/admin", "/props")  # absent on the public listener (/props shows local paths)


def bearer_matches(authorization: str, keys: tuple[str, ...]) -> bool:
    """`Authorization: Bearer <key>` against each key, in constant time."""
    scheme, _, given = authorization.partition(" ")
    match = False
    for key in keys:
        match |= hmac.compare_digest(given.strip().encode(), key.encode())
    return scheme.lower() == "bearer" and match


class Guard:
    """Host allowlist (DNS rebinding) and the bearer keys, before any route runs; /health stays open."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._check(scope)
            if error is not None:
                response = JSONResponse(error.body(), error.status, headers=error.headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> APIError | None:
        state, path = self.state, scope["path"]
        if state.closing:
            return APIError(503, "this listener is shutting down", "server_shutting_down")
        headers = Headers(scope=scope)
        if host_name(headers.get("host", "")) not in state.allowed_hosts:
            return APIError(400, "this Host is not served (DNS rebinding protection)", "invalid_host")
        if state.public and path.startswith(PRIVATE_ONLY):
            return APIError(404, "Not Found", "not_found")
        if path == "/admin" or path.startswith("/admin/"):
            if state.admin_token is None:
                return APIError(404, ADMIN_DISABLED, "not_found")
            keys: tuple[str, ...] = (state.admin_token,)
        else:
            keys = tuple(k for k in (state.api_key, state.admin_token) if k)
        if keys and path != "/health" and not bearer_matches(headers.get("authorization", ""), keys):
            return APIError(
                401,
                "missing or wrong API key (Authorization: Bearer <key>)",
                "unauthorized",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None


# --- errors -----------------------------------------------------------------------------------------
async def render_error(request: Request, exc: Exception) -> Response:
    """The one place that turns exceptions into OpenAI's error shape."""
    if isinstance(exc, APIError):
        error = exc
    elif isinstance(exc, EngineError):
        error = from_engine_error(exc)
    elif isinstance(exc, HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        error = APIError(exc.status_code, str(exc.detail), code)
    else:
        log.exception("unexpected error on %s", request.url.path, exc_info=exc)
        error = APIError(500, f"internal error: {type(exc).__name__}", "internal_error")
    return JSONResponse(error.body(), error.status, headers=error.headers)


# --- helpers shared by the generation routes --------------------------------------------------------
async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    body, size = bytearray(), 0
    async for piece in request.stream():
        size += len(piece)
        if size <= limit:
            body += piece
        elif size > DRAIN_LIMIT + limit:
            break
    if size > limit:
        raise APIError(413, f"the body is over {limit} bytes", "request_too_large")
    return bytes(body)


def chat_body_limit(state: AppState) -> int:
    """A model that reads images takes bodies with room for them (base64: 4 bytes per 3)."""
    props = state.worker.props
    if not (props and props.get("vision")):
        return MAX_BODY_BYTES
    engine = state.settings.engine
    return MAX_BODY_BYTES + engine.max_images * (engine.max_image_bytes * 4 // 3 + 64)


def make_job(state: AppState, body: SamplingRequest, **prompt: Any) -> Job:
    defaults = state.settings.sampling
    return Job(
        params=body.sampling_params(defaults),
        max_tokens=body.max_tokens or body.max_completion_tokens or defaults.max_tokens,
        stop=body.stop_list,
        speculative=body.speculative,
        **prompt,
    )


async def next_result(job: Job) -> Any:
    # A blocking get in a worker thread; abandoned (not awaited) when the client goes away.
    return await anyio.to_thread.run_sync(job.results.get, abandon_on_cancel=True)


def not_loaded(worker_state: str) -> APIError:
    """503 model_not_loaded; while a model loads, clients are told when to try again."""
    headers = {"Retry-After": "2"} if worker_state == "loading" else None
    return APIError(503, f"the model is not ready ({worker_state})", "model_not_loaded", headers=headers)


async def start(state: AppState, job: Job) -> Any:
    """Queue the job and wait for its first result, so that request errors get their HTTP status."""
    state.jobs.add(job)
    try:
        state.worker.submit(job)
    except NotReady:
        raise not_loaded(state.worker.state) from None
    except QueueFull:
        raise APIError(
            503, "the engine is busy; retry shortly", "server_busy", headers={"Retry-After": "1"}
        ) from None
    try:
        first = await next_result(job)
    except BaseException:
        job.cancel.set()
        raise
    if isinstance(first, ShuttingDown):
        raise APIError(503, str(first), "server_shutting_down")
    if isinstance(first, NotReady):  # a model load or unload began while the job waited
        raise not_loaded(str(first))
    if first is END:  # cancelled before it ran: its listener is closing (or its client left)
        raise APIError(503, "the request was cancelled before it ran", "server_shutting_down")
    if isinstance(first, BaseException):
        raise first
    return first


async def chunks(job: Job, first: Any) -> AsyncIterator[Chunk]:
    """The job's chunks; leaving early (disconnect, error) cancels the generation."""
    item = first
    try:
        while item is not END:
            if isinstance(item, BaseException):
                raise item
            yield item
            item = await next_result(job)
    finally:
        job.cancel.set()


async def cancel_on_disconnect(request: Request, job: Job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()


async def collect(request: Request, job: Job, first: Any) -> tuple[str, str | None, SpecStats]:
    """(text, finish_reason, stats) of a whole non-streamed generation."""
    watcher = asyncio.ensure_future(cancel_on_disconnect(request, job))
    text, finish, stats = [], None, SpecStats()
    try:
        async for chunk in chunks(job, first):
            text.append(chunk.text)
            finish = chunk.finish_reason or finish
            stats = chunk.stats or stats
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return "".join(text), finish, stats


def assistant_message(
    text: str, finish: str | None, parser: ToolCallParser | None
) -> tuple[ResponseMessage, str | None]:
    """A whole reply as OpenAI's message (tool calls parsed out when tools were offered), and its finish."""
    if parser is None:
        return ResponseMessage(content=text), finish
    parsed = parser.feed(text) + parser.finish()
    calls = [ToolCallOut.of(call) for call in parsed.calls] or None
    content = parsed.content if parsed.content or calls is None else None
    return ResponseMessage(content=content, tool_calls=calls), finish_reason(finish, parser.n_calls)


def model_id(state: AppState) -> str:
    props = state.worker.props or {}
    return Path(props.get("target", {}).get("path", "model")).stem


def stream_error(exc: Exception) -> str:
    """An error after the stream began: one SSE event in the error shape (the status is already sent)."""
    log.info("stream failed: %s", exc)
    if isinstance(exc, EngineError):
        return error_event(from_engine_error(exc))
    return error_event(APIError(500, f"internal error: {type(exc).__name__}", "internal_error"))


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


def refuse_images(messages: list[dict[str, Any]], props: dict[str, Any] | None) -> None:
    """An image part sent to a model that cannot see is refused by name, never silently dropped."""
    if props is None or props.get("vision"):
        return  # no model yet: the generation itself answers model_not_loaded
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                raise APIError(
                    400,
                    "the loaded model has no vision: it cannot read images (load it with its vision "
                    "projector, or ask without the image)",
                    "model_has_no_vision",
                    f"messages[{i}].content[{j}]",
                )


# --- routes -----------------------------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = _state(request)
    body = parse_body(ChatCompletionRequest, await read_body(request, chat_body_limit(state)))
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    refuse_images(messages, state.worker.props)
    tools = body.template_tools
    prefill = forced_prefill(body.tool_choice) if tools else ""
    job = make_job(state, body, messages=messages, tools=tools, prefill=prefill)
    first = await start(state, job)
    rid, model = new_id("chatcmpl"), model_id(state)
    parser = ToolCallParser([t["function"]["name"] for t in tools], prefill) if tools else None
    if not body.stream:
        text, finish, stats = await collect(request, job, first)
        message, finish = assistant_message(text, finish, parser)
        choice = ChatChoice(message=message, finish_reason=finish)
        completion = ChatCompletion(id=rid, model=model, choices=[choice], usage=Usage.from_stats(stats))
        return JSONResponse(completion.model_dump())

    async def events() -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(choices: list[ChatChunkChoice], **extra: Any) -> str:
            return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices, **extra))

        yield chunk([ChatChunkChoice(delta=Delta(role="assistant", content=""))])
        stats = None
        try:
            async for piece in chunks(job, first):
                content, calls = piece.text, []
                if parser is not None:  # markup is held back until a call is whole
                    parsed = parser.feed(piece.text)
                    if piece.finish_reason is not None:
                        parsed += parser.finish()
                    content, calls = parsed.content, parsed.calls
                if content or piece.text or piece.tokens:
                    choice = ChatChunkChoice(delta=Delta(content=content))
                    yield chunk([choice], speculative_tokens=piece.from_draft)
                if calls:
                    delta = Delta(tool_calls=[ToolCallDelta.of(call) for call in calls])
                    yield chunk([ChatChunkChoice(delta=delta)])
                if piece.finish_reason is not None:
                    finish = finish_reason(piece.finish_reason, parser.n_calls if parser else 0)
                    yield chunk([ChatChunkChoice(delta=Delta(), finish_reason=finish)])
                    stats = piece.stats
        except Exception as exc:
            held = parser.finish().content if parser is not None else ""
            if held:  # text the parser was holding back is still the model's output
                yield chunk([ChatChunkChoice(delta=Delta(content=held))])
            yield stream_error(exc)
        if body.include_usage and stats is not None:
            yield chunk([], usage=Usage.from_stats(stats))
        yield sse("[DONE]")

    return event_stream(events())


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = _state(request)
    body = parse_body(CompletionRequest, await read_body(request))
    job = make_job(state, body, text=body.prompt, suffix=body.suffix)
    first = await start(state, job)
    rid, model = new_id("cmpl"), model_id(state)
    if not body.stream:
        text, finish, stats = await collect(request, job, first)
        choice = CompletionChoice(text=text, finish_reason=finish)
        completion = Completion(id=rid, model=model, choices=[choice], usage=Usage.from_stats(stats))
        return JSONResponse(completion.model_dump(exclude_none=True))

    async def events() -> AsyncIterator[str]:
        created = int(time.time())
        stats = None
        try:
            async for piece in chunks(job, first):
                choice = CompletionChoice(text=piece.text, finish_reason=piece.finish_reason)
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
            yield stream_error(exc)
        if body.include_usage and stats is not None:
            yield sse(
                Completion(id=rid, created=created, model=model, choices=[], usage=Usage.from_stats(stats))
            )
        yield sse("[DONE]")

    return event_stream(events())


@router.get("/v1/models")
async def models(request: Request) -> Response:
    state = _state(request)
    props = state.worker.props
    if props is None:
        raise not_loaded(state.worker.state)
    card = ModelCard(
        id=model_id(state),
        created=state.started,
        context_length=props["target"]["n_ctx"],
        draft=props["draft"]["source"],
    )
    return JSONResponse(ModelList(data=[card]).model_dump())


@router.get("/health")
async def health(request: Request) -> Response:
    state = _state(request)
    worker = state.worker
    status = {"ready": "ok"}.get(worker.state, worker.state)
    body: dict[str, Any] = {"status": status}
    if worker.load_error is not None and not state.public:  # the message names local paths
        body["message"] = str(worker.load_error)
    return JSONResponse(body, 200 if status == "ok" else 503)


@router.get("/props")
async def props(request: Request) -> Response:
    state = _state(request)
    if state.worker.props is None:
        raise not_loaded(state.worker.state)
    server = state.settings.server.model_dump()
    server.update(auth=state.api_key is not None, queue_depth=state.worker.queue_depth)
    if state.port is not None:
        server["port"] = state.port
    return JSONResponse({**state.worker.props, "server": server})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    worker = _state(request).worker
    return PlainTextResponse(
        worker.metrics.prometheus(worker.queue_depth), media_type="text/plain; version=0.0.4"
    )


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
    state = AppState(worker, settings, api_key, allowed, port, admin_token=admin_token, public=public)
    app = FastAPI(title="Foresight engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.foresight = state
    app.include_router(router)
    for kind in (APIError, EngineError, HTTPException, Exception):
        app.add_exception_handler(kind, render_error)
    app.add_middleware(Guard, state=state)
    if server.cors_origin:  # outermost, so that preflight requests are answered before the key check
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[server.cors_origin],
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return app
