"""The one path from any API's request into the worker and back: jobs, results, the reply's tool calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive

from app.engine import grammar
from app.engine.sampling import LogprobTrace, SamplingParams
from app.engine.stats import SpecStats
from app.engine.tools import Parsed, ToolCall, ToolCallParser, finish_reason, forced_prefill
from app.server.admission import Results
from app.server.errors import APIError, stream_error
from app.server.guards import current_caller
from app.server.runner.base import (
    END,
    Job,
    Logprob,
    NotReady,
    Piece,
    PromptCount,
    QueueFull,
    ShuttingDown,
    Started,
)
from app.server.state import AppState

log = logging.getLogger("foresight.server")

MAX_BODY_BYTES = 2 * 1024 * 1024
DRAIN_LIMIT = 16 * MAX_BODY_BYTES  # read (and drop) this much of an oversized body so the client sees 413
HEARTBEAT_S = 15.0


@dataclass(frozen=True)
class Sampling:
    """What any API's request says about sampling and length; None takes the server's setting."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)

    def overrides(self) -> dict[str, Any]:
        """The fields SamplingParams takes (None: the server's setting stays)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("max_tokens", "stop")}


@dataclass
class Submission:
    """A queued job and what reading its reply needs: the tool-call parser (when tools are offered)."""

    job: Job
    parser: ToolCallParser | None
    tools: list[dict[str, Any]] | None


def make_job(
    state: AppState,
    sampling: Sampling,
    *,
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] = "auto",
    text: str | None = None,
    suffix: str | None = None,
    response_grammar: grammar.Grammar | None = None,
    logprobs: int | None = None,
    speculative: bool = True,
    count_only: bool = False,
) -> Submission:
    """A job for the worker from what every API asks: the prompt, its tools, sampling, constraints.

    Tools are shown to the model unless tool_choice is "none"; "required" or a named function starts the
    reply with a call's opening and a grammar keeps the rest to the offered functions' names and schemas.
    """
    offered = tools if tools and tool_choice != "none" else None
    prefill = forced_prefill(tool_choice) if offered else ""
    constraint = response_grammar
    if offered and tool_choice != "auto":
        if response_grammar is not None:
            raise APIError(
                400,
                f"{response_grammar.param}: a structured reply cannot be asked for with a forced tool call",
                "invalid_request_error",
                response_grammar.param,
            )
        named = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
        constraint = grammar.tool_call(offered, named)
    elif offered and response_grammar is not None:
        raise APIError(
            400,
            f"{response_grammar.param}: a structured reply cannot be asked for while tools are offered "
            '(tool_choice "auto"): use tool_choice "none", or offer the schema as a tool',
            "invalid_request_error",
            response_grammar.param,
        )
    defaults = state.settings.sampling
    params = SamplingParams.from_settings(
        defaults,
        **sampling.overrides(),
        grammar=constraint,
        logprobs=LogprobTrace(logprobs) if logprobs is not None else None,
    )
    job = Job(
        params=params,
        max_tokens=sampling.max_tokens or defaults.max_tokens,
        stop=sampling.stop,
        messages=messages,
        tools=offered,
        prefill=prefill,
        text=text,
        suffix=suffix,
        speculative=speculative,
        count_only=count_only,
    )
    names = [t["function"]["name"] for t in offered or []]
    if names:
        log.info("tools offered: %s (tool_choice %s)", ", ".join(names), tool_choice)
    parser = ToolCallParser(names, prefill) if offered else None
    return Submission(job, parser, offered)


# --- reading the body -------------------------------------------------------------------------------
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


# --- running the job --------------------------------------------------------------------------------
async def next_result(job: Job) -> Any:
    # A blocking get in a worker thread; abandoned (not awaited) when the client goes away.
    return await anyio.to_thread.run_sync(job.results.get, abandon_on_cancel=True)


def not_loaded(worker_state: str) -> APIError:
    """503 model_not_loaded; while a model loads, clients are told when to try again."""
    headers = {"Retry-After": "2"} if worker_state == "loading" else None
    return APIError(503, f"the model is not ready ({worker_state})", "model_not_loaded", headers=headers)


async def start(state: AppState, job: Job, streamed: bool = False) -> Any:
    """Queue the job and wait until it has started, so that request errors get their HTTP status.

    A stream returns once the prompt is rendered and fits (its headers go out before a long prefill,
    which clients time out on); anything else waits for the first result."""
    caller = current_caller()
    job.client = caller.client  # the worker keeps each client's KV prefixes apart
    results = state.admission.admit(caller.client, job.cancel)  # 503 or 429 before the worker sees it
    job.results = results  # the engine thread's puts mark the ticket's start and end
    state.jobs.add(job)
    try:
        state.worker.submit(job)
    except NotReady:
        state.admission.withdraw(results.ticket)
        raise not_loaded(state.worker.state) from None
    except QueueFull:
        raise state.admission.busy(results.ticket) from None
    # A client that leaves while its job waits cancels it: the worker drops it before its prefill.
    watcher = asyncio.ensure_future(cancel_on_disconnect(caller.receive, job))
    try:
        first = await next_result(job)
        while isinstance(first, Started) and not streamed:
            first = await next_result(job)
    except BaseException:
        job.cancel.set()
        raise
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    if isinstance(first, ShuttingDown):
        raise APIError(503, str(first), "server_shutting_down")
    if isinstance(first, NotReady):  # a model load or unload began while the job waited
        raise not_loaded(str(first))
    if first is END:  # cancelled before it ran: its listener is closing (or its client left)
        raise APIError(503, "the request was cancelled before it ran", "server_shutting_down")
    if isinstance(first, BaseException):
        raise first
    return first


def admission_headers(job: Job) -> dict[str, str]:
    """The job's admission as response headers: its ticket, its start order and its wait."""
    results = job.results
    return results.ticket.headers() if isinstance(results, Results) else {}


async def count_prompt(state: AppState, job: Job) -> int:
    """The rendered prompt's length in tokens (a count-only job)."""
    result = await start(state, job)
    assert isinstance(result, PromptCount)
    return result.tokens


async def pieces(job: Job, first: Any) -> AsyncIterator[Piece]:
    """The job's pieces; leaving early (disconnect, error) cancels the generation."""
    item = first
    try:
        while item is not END:
            if isinstance(item, BaseException):
                raise item
            if not isinstance(item, Started):
                yield item
            item = await next_result(job)
    finally:
        job.cancel.set()


async def parsed_pieces(submission: Submission, first: Any) -> AsyncIterator[tuple[Piece, Parsed]]:
    """Each piece with what it adds to the reply: content, and the tool calls that closed in it."""
    parser = submission.parser
    async for piece in pieces(submission.job, first):
        if parser is None:
            yield piece, Parsed(piece.text)
            continue
        parsed = parser.feed(piece.text)  # markup is held back until a call is whole
        if piece.finish_reason is not None:
            parsed += parser.finish()
        for call in parsed.calls:
            log.info("tool call %s: %s %s", call.id, call.name, call.arguments)
        yield piece, parsed


def held_text(submission: Submission) -> str:
    """Text the parser still holds when a stream fails: it is the model's output all the same."""
    return submission.parser.finish().content if submission.parser is not None else ""


def reply_finish(submission: Submission, finish: str | None) -> str | None:
    return finish_reason(finish, submission.parser.n_calls if submission.parser else 0)


@dataclass
class Reply:
    """A whole non-streamed reply."""

    content: str
    calls: list[ToolCall]
    finish: str | None  # stop | length | cancelled | tool_calls
    stats: SpecStats
    logprobs: list[Logprob] | None
    stop_sequence: str | None
    prompt_tokens: int


async def cancel_on_disconnect(receive: Receive | None, job: Job) -> None:
    """Cancel the job when its client goes away (the body was read: the next message is the disconnect)."""
    if receive is None:
        return
    while (await receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()


async def collect(request: Request, submission: Submission, first: Any) -> Reply:
    """The whole reply of a non-streamed generation, with its tool calls parsed out."""
    job = submission.job
    watcher = asyncio.ensure_future(cancel_on_disconnect(request.receive, job))
    content, calls, finish, stats, stop = [], [], None, SpecStats(), None
    logprobs: list[Logprob] | None = [] if job.params.logprobs is not None else None
    try:
        async for piece, parsed in parsed_pieces(submission, first):
            content.append(parsed.content)
            calls += parsed.calls
            finish = piece.finish_reason or finish
            stats = piece.stats or stats
            stop = piece.stop_sequence or stop
            if logprobs is not None and piece.logprobs:
                logprobs += piece.logprobs
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return Reply(
        "".join(content),
        calls,
        reply_finish(submission, finish),
        stats,
        logprobs,
        stop,
        job.prompt_tokens or 0,
    )


class StreamEvents(Protocol):
    """One dialect's server-sent events for one streamed reply, as the reply comes."""

    def opening(self) -> list[str]:
        """Before the first piece."""
        ...

    def piece(self, piece: Piece, parsed: Parsed, finish: str | None) -> list[str]:
        """For each piece: its content, the tool calls that closed in it, and on the last its `finish`
        (the reply's finish reason: tool_calls where calls were made)."""
        ...

    def failed(self, error: APIError, held: str) -> list[str]:
        """Where the generation failed: `held` is the text the tool-call parser still held."""
        ...

    def closing(self) -> list[str]:
        """After the last piece of a generation that ended well."""
        ...


async def stream_events(submission: Submission, first: Any, events: StreamEvents) -> AsyncIterator[str]:
    """The submission's pieces as `events` writes them."""
    for event in events.opening():
        yield event
    try:
        async for piece, parsed in parsed_pieces(submission, first):
            finish = (
                reply_finish(submission, piece.finish_reason) if piece.finish_reason is not None else None
            )
            for event in events.piece(piece, parsed, finish):
                yield event
    except Exception as exc:
        error = stream_error(exc)
        for event in events.failed(error, held_text(submission)):
            yield event
        return
    for event in events.closing():
        yield event


def event_stream(events: AsyncIterator[str], headers: dict[str, str] | None = None) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
    return StreamingResponse(with_heartbeats(events), media_type="text/event-stream", headers=headers)


async def with_heartbeats(events: AsyncIterator[str], every_s: float = HEARTBEAT_S) -> AsyncIterator[str]:
    """The events, with an SSE comment whenever none came for `every_s`: a prefill of a long prompt takes
    minutes on a CPU, and clients drop a stream that stays silent (opencode after 5 minutes)."""
    iterator = aiter(events)
    pending: asyncio.Future[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield ": waiting for the model\n\n"
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None:  # the client left mid-wait: stop the events (which cancels the job)
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await iterator.aclose()  # type: ignore[attr-defined]


def model_id(state: AppState) -> str:
    props = state.worker.props or {}
    return Path(props.get("target", {}).get("path", "model")).stem
