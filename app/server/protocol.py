"""OpenAI-compatible request and response types of the engine's HTTP API, and its error shape."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from app.config import SamplingSettings
from app.engine.errors import EngineError, InvalidRequest
from app.engine.sampling import SamplingParams
from app.engine.stats import SpecStats
from app.engine.tools import ToolCall

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
    return APIError(status, str(exc), exc.code, getattr(exc, "param", None))


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


class FunctionCall(_Request):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any]  # OpenAI sends a JSON string; an object is taken too


class ToolCallRequest(_Request):
    """A call the assistant made, in the history a client sends back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, ... reach the chat template as sent

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallRequest] | None = None  # an assistant message's calls
    tool_call_id: str | None = None  # a role "tool" message: the call it answers


class FunctionDefinition(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


def _is_named_choice(choice: Any) -> bool:
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return False
    function = choice.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


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
    tools: list[Tool] | None = None
    # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    tool_choice: Any = "auto"

    @field_validator("tools")
    @classmethod
    def _names_once(cls, tools: list[Tool] | None) -> list[Tool] | None:
        names = [t.function.name for t in tools or []]
        if len(set(names)) < len(names):
            raise PydanticCustomError("tools", "each function name may appear once")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _choice_of_the_tools(cls, choice: Any, info: ValidationInfo) -> str | dict[str, Any]:
        if choice is None or choice in ("none", "auto"):
            return choice or "auto"
        if choice != "required" and not _is_named_choice(choice):
            raise PydanticCustomError(
                "tool_choice",
                'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            )
        names = [t.function.name for t in info.data.get("tools") or []]
        if not names:
            raise PydanticCustomError("tool_choice", "a call is required but no tools are given")
        if choice == "required":
            return "required"
        name = choice["function"]["name"]
        if name not in names:
            raise PydanticCustomError(
                "tool_choice", "function '{name}' is not among the tools", {"name": name}
            )
        return {"type": "function", "function": {"name": name}}

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template shows the model; none for tool_choice "none"."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


class CompletionRequest(SamplingRequest):
    prompt: str
    suffix: str | None = None  # the text after the gap: fill in the middle (FIM models only)


# --- responses --------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose KV was kept from the previous request
    image_tokens: int = 0  # extension: prompt positions filled by images (libmtmd's count)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    speculative: dict[str, Any]  # extension: SpecStats.as_dict()

    @classmethod
    def from_stats(cls, stats: SpecStats) -> Usage:
        return cls(
            prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.emitted,
            total_tokens=stats.prompt_tokens + stats.emitted,
            prompt_tokens_details=PromptTokensDetails(
                cached_tokens=stats.reused_tokens, image_tokens=stats.image_tokens
            ),
            speculative=stats.as_dict(),
        )


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut

    @classmethod
    def of(cls, call: ToolCall) -> ToolCallOut:
        return cls(id=call.id, function=FunctionCallOut(name=call.name, arguments=call.arguments))


class ToolCallDelta(ToolCallOut):
    index: int

    @classmethod
    def of(cls, call: ToolCall) -> ToolCallDelta:
        function = FunctionCallOut(name=call.name, arguments=call.arguments)
        return cls(index=call.index, id=call.id, function=function)


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("tool_calls") is None:
            out.pop("tool_calls", None)  # as OpenAI: the key only when the model called a tool
        return out


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
    tool_calls: list[ToolCallDelta] | None = None  # each call whole, once its block has closed


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
