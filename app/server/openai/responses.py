"""The Responses API's requests (Codex, the openai package's client.responses): instructions and input
items as chat messages, function tools, text formats; nothing is kept between requests."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from app.engine import grammar
from app.server.content import TEXT_PARTS, check_parts
from app.server.errors import APIError
from app.server.fields import RESPONSES_IGNORED, Strict
from app.server.jobs import Sampling
from app.server.openai.protocol import MAX_TOP_LOGPROBS

log = logging.getLogger("foresight.server")
SKIPPED_ITEMS = ("reasoning",)  # a model that does not reason never sends these out, so nothing is lost


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
