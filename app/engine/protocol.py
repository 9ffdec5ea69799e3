"""OpenAI-compatible request and response types of the engine's HTTP API, and its error shape."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from app.config import SamplingSettings
from app.engine.errors import EngineError, InvalidRequest
from app.engine.sampling import SamplingParams
from app.engine.stats import SpecStats

MAX_BODY_BYTES = 2 * 1024 * 1024

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "server_error",
}


# --- errors -----------------------------------------------------------------------------------------
class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "code", "param"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )
        return {"error": {"message": self.message, "type": kind, "code": self.code, "param": self.param}}


def from_engine_error(exc: EngineError) -> APIError:
    """Request errors (bad prompt, too long) are the client's: 400; a failed decode is the server's: 500."""
    status = 400 if isinstance(exc, InvalidRequest) else 500
    return APIError(status, str(exc), exc.code)


def from_validation_error(exc: ValidationError) -> APIError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return APIError(400, f"{param or 'body'}: {first['msg']}", "invalid_request_error", param)


def parse_body(model: type[BaseModel], raw: bytes) -> Any:
    """A request body as `model`; malformed JSON and wrong types are both 400 invalid_request_error."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise APIError(400, "the body is not valid JSON", "invalid_request_error") from exc
        raise from_validation_error(exc) from exc


# --- requests ---------------------------------------------------------------------------------------
class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use


class StreamOptions(_Request):
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_calls, name, ... reach the chat template as sent

    role: str
    content: str | list[dict[str, Any]] | None = None


class SamplingRequest(_Request):
    """Fields shared by chat and text completions; unset fields take the server's sampling settings."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # extension (llama.cpp servers accept it too)
    min_p: float | None = Field(None, ge=0.0, le=1.0)  # extension
    repeat_penalty: float | None = Field(None, ge=0.0, le=5.0)  # extension
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: bool = True  # extension: false decodes plainly (for comparisons)

    def sampling_params(self, defaults: SamplingSettings) -> SamplingParams:
        return SamplingParams.from_settings(
            defaults,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            seed=self.seed,
        )

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None


class CompletionRequest(SamplingRequest):
    prompt: str


# --- responses --------------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    speculative: dict[str, Any]  # extension: SpecStats.as_dict()

    @classmethod
    def from_stats(cls, stats: SpecStats) -> Usage:
        return cls(
            prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.emitted,
            total_tokens=stats.prompt_tokens + stats.emitted,
            speculative=stats.as_dict(),
        )


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: str | None
    logprobs: None = None


class _Response(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None

    @field_serializer("delta")
    def _delta(self, delta: Delta) -> dict[str, Any]:
        return delta.model_dump(exclude_none=True)  # OpenAI sends only the fields a delta sets


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    speculative_tokens: list[bool] = []  # extension: per token of this chunk, an accepted draft token
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(_Response):
    """A whole text completion, or one streamed piece of one (OpenAI uses the same object for both)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    speculative_tokens: list[bool] | None = None  # extension, on streamed pieces
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "foresight"
    context_length: int  # extension
    draft: str  # extension: the draft source (none | ngram | model | cross-vocab)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def error_event(error: APIError) -> str:
    return f"data: {json.dumps(error.body())}\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def sse(payload: BaseModel | str) -> str:
    """One server-sent event line carrying a response object (or the literal [DONE])."""
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=False)
    return f"data: {data}\n\n"
