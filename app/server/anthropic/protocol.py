"""Anthropic Messages requests as the engine takes them: content blocks to chat messages, tools, choices."""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from pydantic import Field

from app.engine import grammar
from app.server.content import IMAGE_PARTS
from app.server.errors import APIError
from app.server.fields import MESSAGES_IGNORED, Lenient, Strict, stop_list
from app.server.jobs import Sampling

log = logging.getLogger("foresight.server")

TOOL_NAME = r"^[A-Za-z0-9_-]{1,128}$"
SKIPPED_BLOCKS = ("thinking", "redacted_thinking")  # a model that does not think has nothing to add to them


def _refuse(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_request_error", param)


class AnthropicMessage(Lenient):
    role: Literal["user", "assistant", "system"]  # system: some clients put it among the messages
    content: str | list[dict[str, Any]]


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None  # one call or several: the reply is parsed either way

    ignored = frozenset({"disable_parallel_tool_use"})


class OutputFormat(Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    format: OutputFormat | None = None
    effort: str | None = None  # how hard a reasoning model thinks: nothing to vary here

    ignored = frozenset({"effort"})


class CountTokensRequest(Strict):
    """/v1/messages/count_tokens: what the prompt would be, without max_tokens."""

    ignored = MESSAGES_IGNORED

    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None

    def chat(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        """(OpenAI chat messages, OpenAI function tools, names of tools dropped as not ours)."""
        tools, dropped = openai_tools(self.tools or [])
        return chat_messages(self.system, self.messages), tools, dropped

    def openai_tool_choice(self) -> str | dict[str, Any]:
        choice = self.tool_choice
        if choice is None or choice.type == "auto":
            return "auto"
        if choice.type == "none":
            return "none"
        if not self.tools:
            raise _refuse("tool_choice", "a tool use is required but no tools are given")
        if choice.type == "any":
            return "required"
        names = [t.get("name") for t in self.tools]
        if choice.name not in names:
            raise _refuse("tool_choice.name", f"tool {choice.name!r} is not among the tools")
        return {"type": "function", "function": {"name": choice.name}}


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's name for output_config.format
    speculative: bool = True  # extension, as on the OpenAI routes

    def sampling(self) -> Sampling:
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=stop_list(self.stop_sequences, "stop_sequences"),
        )

    def response_grammar(self) -> grammar.Grammar | None:
        if self.output_config is not None and self.output_config.format is not None:
            return grammar.json_schema(self.output_config.format.json_schema, "output_config.format.schema")
        if self.output_format is not None:
            return grammar.json_schema(self.output_format.json_schema, "output_format.schema")
        return None


def openai_tools(tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Custom tools as OpenAI function tools; Anthropic's own tool types (server tools such as web search,
    or the trained bash and editor tools) have no schema to show this model: dropped, and named."""
    out, dropped = [], []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        name = tool.get("name")
        if kind not in (None, "custom"):
            dropped.append(str(name or kind))
            continue
        if not isinstance(name, str) or not name:
            raise _refuse(f"tools[{i}].name", "a tool needs a name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _refuse(f"tools[{i}].input_schema", "a custom tool needs its input_schema (an object)")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if tool.get("description"):
            function["description"] = str(tool["description"])
        out.append({"type": "function", "function": function})
    if dropped:
        log.info("messages: tools dropped (not custom tools): %s", ", ".join(dropped))
    return out, dropped


def _system_text(system: str | list[dict[str, Any]] | None, param: str) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for j, block in enumerate(system):
        if block.get("type") != "text":
            raise _refuse(f"{param}[{j}]", f"system blocks are text, not {block.get('type')!r}")
        texts.append(str(block.get("text", "")))
    return "\n\n".join(texts)


def _image_part(block: dict[str, Any], param: str) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url", ""))  # the engine refuses URLs it would have to fetch, by name
    else:
        raise _refuse(f"{param}.source", f"image sources are base64 or url, not {source.get('type')!r}")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result_text(block: dict[str, Any], param: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    else:
        texts = []
        for k, part in enumerate(content or []):
            if part.get("type") != "text":
                raise _refuse(
                    f"{param}.content[{k}]", f"{part.get('type')!r} parts of a tool result are not read"
                )
            texts.append(str(part.get("text", "")))
        text = "\n".join(texts)
    return f"Error: {text}" if block.get("is_error") else text


def chat_messages(
    system: str | list[dict[str, Any]] | None, messages: list[AnthropicMessage]
) -> list[dict[str, Any]]:
    """Anthropic's system and messages as OpenAI chat messages: tool_use blocks become the assistant's
    tool_calls, tool_result blocks role "tool" messages (each must answer a tool_use before it)."""
    out: list[dict[str, Any]] = []
    system_text = _system_text(system, "system")
    if system_text:
        out.append({"role": "system", "content": system_text})
    calls: dict[str, str] = {}  # tool_use id -> tool name, from the assistant turns so far
    for i, message in enumerate(messages):
        blocks = (
            [{"type": "text", "text": message.content}]
            if isinstance(message.content, str)
            else message.content
        )
        if message.role == "system":
            out.append({"role": "system", "content": _system_text(blocks, f"messages[{i}].content")})
        elif message.role == "assistant":
            out.append(_assistant(blocks, f"messages[{i}].content", calls))
        else:
            out += _user(blocks, f"messages[{i}].content", calls)
    return out


def _assistant(blocks: list[dict[str, Any]], param: str, calls: dict[str, str]) -> dict[str, Any]:
    text, tool_calls = [], []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise _refuse(f"{param}[{j}]", "a tool_use block needs an id and a name")
            calls[call_id] = name
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            tool_calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind not in SKIPPED_BLOCKS:
            raise _refuse(f"{param}[{j}]", f"{kind!r} blocks are not supported in assistant turns")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _user(blocks: list[dict[str, Any]], param: str, calls: dict[str, str]) -> list[dict[str, Any]]:
    results, parts = [], []
    for j, block in enumerate(blocks):
        kind, where = block.get("type"), f"{param}[{j}]"
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if call_id not in calls:
                raise _refuse(
                    f"{where}.tool_use_id", f"no tool_use with id {call_id!r} comes before this result"
                )
            results.append(
                {"role": "tool", "tool_call_id": call_id, "content": _tool_result_text(block, where)}
            )
        elif kind in IMAGE_PARTS:
            raise _refuse(where, f"{kind!r} is OpenAI's part: Anthropic images are 'image' blocks")
        else:
            raise _refuse(where, f"{kind!r} blocks are not supported")
    out = list(results)
    if parts:
        text_only = all(p["type"] == "text" for p in parts)
        content: Any = "".join(p["text"] for p in parts) if text_only else parts
        out.append({"role": "user", "content": content})
    return out
