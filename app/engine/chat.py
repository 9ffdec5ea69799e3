"""Chat prompts: the model's own Jinja template from GGUF, or the family's turn format when it has none."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.engine.errors import InvalidRequest
from app.engine.tools import template_format

Message = Mapping[str, Any]


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # As Hugging Face renders templates (the text models were trained on): keys in the order given and
    # no HTML escaping, where Jinja's own filter sorts keys and writes < as \u003c.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env


def message_text(content: Any) -> str:
    """Text of an OpenAI message content: a string, or a list of parts of which the text ones count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise InvalidRequest(f"message content must be a string or a list of parts, not {type(content).__name__}")


def _template_message(message: Message) -> dict[str, Any]:
    """A message as chat templates expect it: text content, and tool-call arguments as an object.

    OpenAI sends arguments as a JSON string; templates (Qwen2.5's `arguments | tojson`) were written
    for the object, and would otherwise show the model a quoted string it never wrote.
    """
    out = dict(message, content=message_text(message.get("content")))
    calls = message.get("tool_calls")
    if isinstance(calls, Sequence):
        out["tool_calls"] = [_call_with_object_arguments(call) for call in calls]
    return out


def _call_with_object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return dict(call, function=dict(function, arguments=arguments))


CONTINUE_PARAM = "continue_final_message"


def continued(messages: Sequence[Message]) -> tuple[list[Message], str]:
    """To continue a final assistant message (an answer cut short): the messages before it, and its text.

    The template renders those messages and opens the assistant's turn as for a new reply; the text
    follows, the turn left open, so the model carries on from where the answer stopped (the prompt it
    was answering, plus what it had written: the engine's cached tokens still match it)."""
    if not messages or not isinstance(messages[-1], Mapping) or messages[-1].get("role") != "assistant":
        refusal = InvalidRequest(
            f"{CONTINUE_PARAM}: the last message must be the assistant's, the answer to continue"
        )
        refusal.param = CONTINUE_PARAM  # type: ignore[attr-defined]
        raise refusal
    return list(messages[:-1]), message_text(messages[-1].get("content"))


class ChatFormat:
    """Renders messages to prompt text; `source` says which format is used (reported in /props)."""

    def __init__(self, template: str | None, architecture: str) -> None:
        self.architecture = architecture
        self.stop: list[str] = []
        self.tool_format = template_format(template)  # None: requests with tools are refused
        self._template: jinja2.Template | None = None
        if template:
            try:
                self._template = _environment().from_string(template)
            except jinja2.TemplateError as exc:
                raise InvalidRequest(f"the model's chat template does not compile: {exc}") from exc
            self.source = "gguf"
        elif architecture.startswith("gemma"):
            self.source = "fallback:gemma"
        else:
            self.source = "fallback:plain"
            self.stop = ["\nUser:"]

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        if not messages:
            raise InvalidRequest("messages must not be empty")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m:
                raise InvalidRequest(f"messages[{i}] needs a role")
        if tools and self.tool_format is None:
            raise InvalidRequest(
                f"this model's chat format ({self.source}) cannot take tools: it needs a chat template "
                "that renders them in the <tool_call> format (Qwen2.5, Hermes)"
            )
        if self._template is not None:
            normalised = [_template_message(m) for m in messages]
            try:
                return self._template.render(
                    messages=normalised,
                    tools=list(tools) if tools else None,
                    add_generation_prompt=add_generation_prompt,
                    bos_token="",  # tokenization adds BOS when the model wants one
                    eos_token="",
                )
            except jinja2.TemplateError as exc:
                raise InvalidRequest(f"the chat template rejected these messages: {exc}") from exc
        if self.source == "fallback:gemma":
            return self._render_gemma(messages, add_generation_prompt)
        return self._render_plain(messages, add_generation_prompt)

    @staticmethod
    def _render_gemma(messages: Sequence[Message], add_generation_prompt: bool) -> str:
        # Gemma has no system role: the system text opens the first user turn.
        system = "\n\n".join(message_text(m.get("content")) for m in messages if m["role"] == "system")
        out = []
        for m in messages:
            role = m["role"]
            if role == "system":
                continue
            text = message_text(m.get("content"))
            if role == "user" and system:
                text, system = f"{system}\n\n{text}", ""
            turn = "model" if role == "assistant" else "user"
            out.append(f"<start_of_turn>{turn}\n{text}<end_of_turn>\n")
        if add_generation_prompt:
            out.append("<start_of_turn>model\n")
        return "".join(out)

    @staticmethod
    def _render_plain(messages: Sequence[Message], add_generation_prompt: bool) -> str:
        names = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
        out = [
            f"{names.get(m['role'], str(m['role']).title())}: {message_text(m.get('content'))}\n"
            for m in messages
        ]
        if add_generation_prompt:
            out.append("Assistant:")
        return "".join(out)
