"""Tool calls in model text: `<tool_call>{json}</tool_call>` blocks (Qwen2.5, Hermes), parsed as streamed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def template_format(template: str | None) -> str | None:
    """The tool-call format a chat template teaches: "hermes" (`<tool_call>` blocks), or None (no tools)."""
    if template and "tools" in template and OPEN in template:
        return "hermes"
    return None


def forced_prefill(tool_choice: str | dict[str, Any] | None) -> str:
    """Assistant text that forces a call: a named function's opening, or any function's for "required".

    It ends before the space that models write after a colon, so the model's next token is an ordinary one.
    """
    if isinstance(tool_choice, dict):
        return f'{OPEN}\n{{"name": {json.dumps(tool_choice["function"]["name"])}, "arguments":'
    if tool_choice == "required":
        return f'{OPEN}\n{{"name": "'
    return ""


def finish_reason(finish: str | None, n_calls: int) -> str | None:
    """OpenAI's "tool_calls" when a reply that ended by itself called a tool."""
    return "tool_calls" if n_calls and finish == "stop" else finish


@dataclass(frozen=True)
class ToolCall:
    index: int  # position among this response's calls (stream deltas carry it)
    id: str
    name: str
    arguments: str  # a JSON text, as OpenAI sends it

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Parsed:
    """What a piece of model text adds: content for the user, and whole tool calls."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __add__(self, other: Parsed) -> Parsed:
        return Parsed(self.content + other.content, self.calls + other.calls)


def _call_object(body: str) -> Any:
    """The JSON of a block; also the doubled-brace form `{{"name": ..., "arguments": {...}}}}` that
    Qwen2.5-Coder copies from its template's example (the template writes the braces Jinja-escaped)."""
    try:
        return json.loads(body)
    except ValueError:
        pass
    if not body.startswith("{{"):
        return None
    inner = "{" + body.lstrip("{")
    try:
        data, end = json.JSONDecoder().raw_decode(inner)
    except ValueError:
        return None
    return data if inner[end:].strip().strip("}").strip() == "" else None


def parse_call(body: str, index: int) -> ToolCall | None:
    """A tool call from the JSON inside one block, or None when it is not one."""
    data = _call_object(body.strip())
    if not isinstance(data, dict):
        return None
    name = data.get("name")
    arguments = data.get("arguments", data.get("parameters", {}))
    if not isinstance(name, str) or not name or not isinstance(arguments, dict | str):
        return None
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(index, f"call_{uuid.uuid4().hex[:24]}", name, arguments)


@dataclass(frozen=True)
class _Block:
    open: str
    close: str


TAGGED = _Block(OPEN, CLOSE)
# Qwen2.5-Coder often writes its call as a fenced JSON block instead (llama.cpp's parser takes it too).
FENCED = _Block("```json", "```")


class ToolCallParser:
    """Splits model text, fed in pieces of any size, into content and tool calls.

    Calls come in `<tool_call>` or ```json blocks, and count only when they name one of the offered
    tools: a call to any other name stays text, so a client never gets a call it cannot run. Markup
    never reaches the content: a possible start of a block is held until it is decided, and a block
    until its end. Whitespace around calls is dropped (it only separates them). A block that is not a
    call stays in the content as written. The result does not depend on how the text was split, so a
    stream and a whole response agree.
    """

    def __init__(self, offered: Collection[str] = (), prefill: str = "") -> None:
        """`offered`: the function names of the request's tools; `prefill`: text the reply began with."""
        self._offered = frozenset(offered)
        self._blocks = (TAGGED, FENCED) if self._offered else (TAGGED,)
        self._pending = ""  # text not yet decided
        self._gap = ""  # whitespace before the open block: dropped if it is a call, content if not
        self._inside: _Block | None = None
        self._skip_space = False  # just after a call: leading whitespace is a separator
        self._n_calls = 0
        if prefill:
            self.feed(prefill)

    @property
    def n_calls(self) -> int:
        return self._n_calls

    def feed(self, text: str) -> Parsed:
        self._pending += text
        out = Parsed()
        while True:
            block = self._inside
            if block is FENCED:
                body = self._pending.lstrip()
                if body and body[0] != "{":  # a JSON block, but not an object: text from here on
                    out += self._not_a_call(self._pending[: len(self._pending) - len(body)], "")
                    self._pending = body
                    continue
            if block is not None:
                end = self._pending.find(block.close)
                if end < 0:
                    return out
                out += self._close(self._pending[:end])
                self._pending = self._pending[end + len(block.close) :]
                continue
            if self._skip_space:
                self._pending = self._pending.lstrip()
                if not self._pending:
                    return out
                self._skip_space = False
            found = [(i, b) for b in self._blocks if (i := self._pending.find(b.open)) >= 0]
            if found:
                start, block = min(found, key=lambda hit: hit[0])
                before = self._pending[:start]
                text_before = before.rstrip()
                out.content += text_before
                self._gap = before[len(text_before) :]
                self._pending = self._pending[start + len(block.open) :]
                self._inside = block
                continue
            hold = max(_partial(self._pending, b.open) for b in self._blocks)
            decided = self._pending[: len(self._pending) - hold].rstrip()
            out.content += decided
            self._pending = self._pending[len(decided) :]
            return out

    def finish(self) -> Parsed:
        """The rest at the end of generation: an unclosed block counts if its JSON is a whole call."""
        out = Parsed()
        if self._inside is not None:
            call = self._call(self._pending)
            out += Parsed(calls=[call]) if call is not None else self._not_a_call(self._pending, "")
        else:
            out.content += self._pending.rstrip() if self._n_calls else self._pending
        self._pending = ""
        return out

    def _call(self, body: str) -> ToolCall | None:
        assert self._inside is not None
        call = parse_call(body.strip(), self._n_calls)
        if call is None or call.name not in self._offered:
            return None
        self._inside = None
        self._n_calls += 1
        self._skip_space = True
        return call

    def _close(self, body: str) -> Parsed:
        assert self._inside is not None
        call = self._call(body)
        if call is None:
            return self._not_a_call(body, self._inside.close)
        return Parsed(calls=[call])

    def _not_a_call(self, body: str, close: str) -> Parsed:
        assert self._inside is not None
        text = self._gap + self._inside.open + body + close
        self._inside = None
        return Parsed(text)


def _partial(text: str, opener: str) -> int:
    """Length of the longest end of `text` that could begin `opener`."""
    for n in range(min(len(opener) - 1, len(text)), 0, -1):
        if opener.startswith(text[-n:]):
            return n
    return 0
