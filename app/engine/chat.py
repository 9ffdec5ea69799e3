"""Chat prompts: the model's own Jinja template from GGUF, or the family's turn format when it has none."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.engine.errors import InvalidRequest

Message = Mapping[str, Any]


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
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


class ChatFormat:
    """Renders messages to prompt text; `source` says which format is used (reported in /props)."""

    def __init__(self, template: str | None, architecture: str) -> None:
        self.architecture = architecture
        self.stop: list[str] = []
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
        if self._template is not None:
            normalised = [dict(m, content=message_text(m.get("content"))) for m in messages]
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
