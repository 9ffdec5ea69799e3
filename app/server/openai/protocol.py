"""OpenAI-compatible request and response types of chat and text completions, and the model list."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from app.engine import grammar
from app.engine.stats import SpecStats
from app.engine.tools import ToolCall
from app.server.content import TEXT_PARTS, check_parts
from app.server.errors import APIError
from app.server.fields import CHAT_IGNORED, COMPLETION_IGNORED, Lenient, Strict, stop_list
from app.server.jobs import Sampling
from app.server.openai.logprobs import ChoiceLogprobs, CompletionLogprobs

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat; completions allow 5


# --- requests ---------------------------------------------------------------------------------------
class StreamOptions(Strict):
    include_usage: bool = False
    ignored = frozenset({"include_obfuscation"})  # obfuscation pads stream events: nothing to hide here


class FunctionCall(Lenient):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any]  # OpenAI sends a JSON string; an object is taken too


class ToolCallRequest(Lenient):
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


class FunctionDefinition(Lenient):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object
    strict: bool | None = None


class Tool(Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class JsonSchemaFormat(Strict):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None  # the grammar follows the schema either way


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def grammar(self, param: str = "response_format") -> grammar.Grammar | None:
        if self.type == "json_object":
            return grammar.json_object(param)
        if self.type == "json_schema":
            if self.json_schema is None:
                raise APIError(400, f"{param}: json_schema needs its schema", "invalid_request_error", param)
            return grammar.json_schema(self.json_schema.json_schema, f"{param}.json_schema.schema")
        return None


def _is_named_choice(choice: Any) -> bool:
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return False
    function = choice.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


class SamplingRequest(Strict):
    """Fields shared by chat and text completions; unset fields take the server's sampling settings."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # wins over max_tokens, as OpenAI's newer name
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # extension (llama.cpp servers accept it too)
    min_p: float | None = Field(None, ge=0.0, le=1.0)  # extension
    repeat_penalty: float | None = Field(None, ge=0.0, le=5.0)  # extension
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> -100..100 added to its logit
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: bool = True  # extension: false decodes plainly (for comparisons)

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit():
                raise PydanticCustomError("logit_bias", "keys are token ids, not {key!r}", {"key": key})
            if not -100.0 <= value <= 100.0:
                raise PydanticCustomError("logit_bias", "biases lie in -100..100")
        return bias

    def sampling(self) -> Sampling:
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=tuple((int(k), v) for k, v in (self.logit_bias or {}).items()),
            seed=self.seed,
            max_tokens=self.max_completion_tokens or self.max_tokens,
            stop=stop_list(self.stop),
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingRequest):
    ignored = CHAT_IGNORED

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    tool_choice: Any = "auto"
    response_format: ResponseFormat | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    modalities: list[Literal["text"]] | None = None  # audio output is not served
    # extension (vLLM's name), private listener only: carry on from the last message, the assistant's
    continue_final_message: bool = False

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
        return tool_choice_of([t.function.name for t in info.data.get("tools") or []], choice)

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):
            raise PydanticCustomError("top_logprobs", "top_logprobs needs logprobs: true")
        return top

    @property
    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    @property
    def logprobs_top(self) -> int | None:
        """None: no logprobs; else how many alternatives each token lists."""
        return (self.top_logprobs or 0) if self.logprobs else None


def tool_choice_of(names: list[str], choice: Any) -> str | dict[str, Any]:
    """OpenAI's tool_choice checked against the offered names: "auto", "none", "required" or a named one."""
    if choice is None or choice in ("none", "auto"):
        return choice or "auto"
    if choice != "required" and not _is_named_choice(choice):
        raise PydanticCustomError(
            "tool_choice",
            'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
        )
    if not names:
        raise PydanticCustomError("tool_choice", "a call is required but no tools are given")
    if choice == "required":
        return "required"
    name = choice["function"]["name"]
    if name not in names:
        raise PydanticCustomError("tool_choice", "function '{name}' is not among the tools", {"name": name})
    return {"type": "function", "function": {"name": name}}


def chat_messages(messages: list[ChatMessage], param: str = "messages") -> list[dict[str, Any]]:
    """Messages for the chat template: roles and content parts checked, each refusal naming its place.

    "developer" (OpenAI's newer name for the system role) is rendered as "system".
    """
    out = []
    for i, message in enumerate(messages):
        m = message.model_dump(exclude_none=True)
        if m["role"] not in CHAT_ROLES:
            raise APIError(
                400,
                f"{param}[{i}].role: {m['role']!r} is not a role ({', '.join(CHAT_ROLES)})",
                "invalid_request_error",
                f"{param}[{i}].role",
            )
        if m["role"] == "developer":
            m["role"] = "system"
        if isinstance(m.get("content"), list):
            check_parts(m["content"], f"{param}[{i}].content")
            m["content"] = [_as_text_part(part) for part in m["content"]]
        out.append(m)
    return out


def _as_text_part(part: dict[str, Any]) -> dict[str, Any]:
    """Text parts as the chat template reads them: {"type": "text", "text": ...}, whatever their name."""
    if part["type"] in TEXT_PARTS and part["type"] != "text":
        return {"type": "text", "text": str(part.get("text", part.get("refusal", "")))}
    return part


class CompletionRequest(SamplingRequest):
    ignored = COMPLETION_IGNORED

    prompt: str
    suffix: str | None = None  # the text after the gap: fill in the middle (FIM models only)
    logprobs: int | None = Field(None, ge=0, le=5)  # alternatives listed per token (0: the token's own only)
    echo: Literal[False] = False  # the prompt is not repeated in the answer
    best_of: Literal[1] = 1


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


class FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str


class ToolCallDelta(BaseModel):
    """A streamed call: its first delta names it (arguments ""), the next carries the arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        for key in ("id", "type"):
            if out.get(key) is None:
                out.pop(key, None)
        if out["function"].get("name") is None:
            out["function"].pop("name", None)
        return out

    @classmethod
    def opening(cls, call: ToolCall) -> ToolCallDelta:
        return cls(
            index=call.index,
            id=call.id,
            type="function",
            function=FunctionDelta(name=call.name, arguments=""),
        )

    @classmethod
    def arguments(cls, call: ToolCall) -> ToolCallDelta:
        return cls(index=call.index, function=FunctionDelta(arguments=call.arguments))


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
    logprobs: ChoiceLogprobs | None = None


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
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None

    @field_serializer("delta")
    def _delta(self, delta: Delta) -> dict[str, Any]:
        out = delta.model_dump(exclude_none=True)  # OpenAI sends only the fields a delta sets
        if delta.tool_calls is not None:
            out["tool_calls"] = [call.model_dump() for call in delta.tool_calls]
        return out


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    speculative_tokens: list[bool] = []  # extension: per token of this chunk, an accepted draft token
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


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


def sse(payload: BaseModel | str) -> str:
    """One server-sent event line carrying a response object (or the literal [DONE])."""
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=False)
    return f"data: {data}\n\n"
