"""Tool calls without a model: the incremental `<tool_call>` parser, and how templates render tools."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from app.engine.backends.base import read_model_header
from app.engine.chat import ChatFormat
from app.engine.errors import InvalidRequest
from app.engine.tools import (
    Parsed,
    ToolCallParser,
    finish_reason,
    forced_prefill,
    parse_call,
    template_format,
)

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
# how Qwen2.5-Coder-1.5B answers the server test's question at temperature 0
FENCED_WEATHER = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
OFFERED = ("get_weather", "get_time", "f")
NOT_OFFERED = '```json\n{"name": "Ada", "arguments": []}\n```'
CODE_BLOCKS = "```json\n[1, 2]\n```\nand ```python\nx = 1\n```"


def parse(text: str, pieces: int | None = None, prefill: str = "", offered: tuple = OFFERED) -> Parsed:
    """The whole text through a parser, fed in one piece or in pieces of `pieces` characters."""
    parser = ToolCallParser(offered, prefill)
    out = Parsed()
    step = pieces or max(len(text), 1)
    for i in range(0, len(text), step):
        out += parser.feed(text[i : i + step])
    return out + parser.finish()


def calls(parsed: Parsed) -> list[tuple[int, str, dict]]:
    return [(c.index, c.name, json.loads(c.arguments)) for c in parsed.calls]


# --- the parser -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "content", "expected"),
    [
        ("Just text, no calls.\n", "Just text, no calls.\n", []),
        (WEATHER, "", [(0, "get_weather", {"city": "Paris"})]),
        (
            f"Let me check.\n{WEATHER}\n{TIME}",
            "Let me check.",
            [(0, "get_weather", {"city": "Paris"}), (1, "get_time", {"zone": "CET"})],
        ),
        (f"{WEATHER}\nDone.", "Done.", [(0, "get_weather", {"city": "Paris"})]),
        ("a < b and a <tool but not a call", "a < b and a <tool but not a call", []),
        ("ends with a partial tag <tool_c", "ends with a partial tag <tool_c", []),
        (
            '<tool_call>\n{"name": "f", "parameters": {"x": [1, 2]}}\n</tool_call>',
            "",
            [(0, "f", {"x": [1, 2]})],
        ),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', "", [(0, "f", {})]),
        # a closed JSON without its closing tag when generation ended still counts
        ('<tool_call>\n{"name": "f", "arguments": {"q": "é"}}', "", [(0, "f", {"q": "é"})]),
        (FENCED_WEATHER, "", [(0, "get_weather", {"city": "Paris"})]),
        (
            f"Checking.\n\n{FENCED_WEATHER}\n{TIME}",
            "Checking.",
            [(0, "get_weather", {"city": "Paris"}), (1, "get_time", {"zone": "CET"})],
        ),
        # fenced JSON that calls no offered tool is just a code block
        (NOT_OFFERED, NOT_OFFERED, []),
        (CODE_BLOCKS, CODE_BLOCKS, []),
    ],
    ids=[
        "text",
        "one-call",
        "text-then-two",
        "call-then-text",
        "lookalikes",
        "partial-tag",
        "parameters",
        "no-arguments",
        "unclosed-whole",
        "fenced",
        "text-fenced-tagged",
        "fenced-not-offered",
        "code-blocks",
    ],
)
@pytest.mark.parametrize("pieces", [None, 1, 3, 7], ids=["whole", "by-1", "by-3", "by-7"])
def test_calls_and_content_do_not_depend_on_how_text_arrives(
    text: str, content: str, expected: list, pieces: int | None
) -> None:
    parsed = parse(text, pieces)
    assert parsed.content == content
    assert calls(parsed) == expected


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>',  # cut JSON
        "<tool_call>\nnot json at all\n</tool_call>",
        '<tool_call>\n["get_weather"]\n</tool_call>',  # JSON, but not a call object
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "f", "arguments": 3}\n</tool_call>',
    ],
    ids=["cut-json", "not-json", "array", "no-name", "number-arguments"],
)
@pytest.mark.parametrize("pieces", [None, 1], ids=["whole", "by-1"])
def test_a_malformed_block_stays_content_as_written(block: str, pieces: int | None) -> None:
    text = f"Before.\n{block}\nAfter."
    parsed = parse(text, pieces)
    assert parsed.content == text
    assert parsed.calls == []


def test_fenced_calls_count_only_when_tools_were_offered() -> None:
    parsed = parse(FENCED_WEATHER, offered=())
    assert parsed.content == FENCED_WEATHER
    assert parsed.calls == []


def test_random_splits_give_the_same_result_as_the_whole_text() -> None:
    parts = [WEATHER, TIME, FENCED_WEATHER, NOT_OFFERED, "Text, ", " \n", "<tool", "```", "```json\n[1]\n```"]
    parts += ["a <b> c", '<tool_call>{"name": 1}</tool_call>', "\n\n", "`code`", "<tool_call>\nbroken"]
    rng = random.Random(1234)
    for _ in range(300):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 6)))
        whole = parse(text)
        parser, split = ToolCallParser(OFFERED), Parsed()
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8))))
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            split += parser.feed(text[a:b])
        split += parser.finish()
        assert (split.content, calls(split)) == (whole.content, calls(whole)), text


def test_an_unclosed_block_that_is_not_a_call_is_content() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "argu'  # generation hit max_tokens
    assert parse(text, 2).content == text
    assert parse(text).calls == []


def test_markup_is_never_released_before_it_is_decided() -> None:
    parser = ToolCallParser(OFFERED)
    released = [parser.feed(ch) for ch in f"Checking. {WEATHER}"]
    text = "".join(p.content for p in released)
    assert "<" not in text
    assert text == "Checking."
    assert [i for i, p in enumerate(released) if p.calls] == [len(released) - 1]  # at the closing ">"


def test_a_call_after_a_valid_one_keeps_counting_indexes_and_ids_are_unique() -> None:
    parsed = parse(WEATHER + WEATHER + WEATHER, 5)
    assert [c.index for c in parsed.calls] == [0, 1, 2]
    assert len({c.id for c in parsed.calls}) == 3
    assert all(c.id.startswith("call_") for c in parsed.calls)


def test_arguments_come_out_as_a_json_string() -> None:
    call = parse_call('{"name": "f", "arguments": {"city": "Zürich", "days": 2}}', 0)
    assert call is not None
    assert call.openai() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "f", "arguments": '{"city": "Zürich", "days": 2}'},
    }
    as_string = parse_call('{"name": "f", "arguments": "{\\"a\\": 1}"}', 0)
    assert as_string is not None
    assert as_string.arguments == '{"a": 1}'


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("choice", "rest", "name"),
    [
        (NAMED, ' {"city": "Paris"}}\n</tool_call>', None),
        ("required", 'get_time", "arguments": {"zone": "CET"}}\n</tool_call>', "get_time"),
    ],
    ids=["named", "required"],
)
def test_a_forced_call_parses_with_its_prefill(choice: object, rest: str, name: str | None) -> None:
    prefill = forced_prefill(choice)  # type: ignore[arg-type]
    assert prefill.startswith("<tool_call>\n")
    parsed = parse(rest, 2, prefill=prefill)
    assert parsed.content == ""
    assert [c.name for c in parsed.calls] == [name or "get_weather"]
    assert forced_prefill("auto") == forced_prefill("none") == ""


def test_finish_reason_says_tool_calls_only_for_a_reply_that_ended_by_itself() -> None:
    assert finish_reason("stop", 1) == "tool_calls"
    assert finish_reason("stop", 0) == "stop"
    assert finish_reason("length", 1) == "length"


# --- templates --------------------------------------------------------------------------------------
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city <as text> & 'quoted'",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def qwen_chat(qwen_path: Path) -> ChatFormat:
    header = read_model_header(qwen_path)  # the header only: no weights are loaded
    return ChatFormat(header.chat_template, header.architecture)


def test_qwen_template_renders_tools_calls_and_results(qwen_chat: ChatFormat) -> None:
    assert qwen_chat.tool_format == "hermes"
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    text = qwen_chat.render(messages, [TOOL])
    # the tool as the model was trained to see it: keys in order, no HTML escaping
    assert "<tools>\n" + json.dumps(TOOL, ensure_ascii=False) + "\n</tools>" in text
    # the call as the model itself writes it: arguments as an object, not a quoted string
    written = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{written}<|im_end|>" in text
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    # the block the template writes is what the parser reads back
    block = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert calls(parse(block)) == [(0, "get_weather", {"city": "Paris"})]


def test_qwen_template_without_tools_has_no_tool_section(qwen_chat: ChatFormat) -> None:
    text = qwen_chat.render([{"role": "user", "content": "hi"}])
    assert "<tools>" not in text


def test_a_format_without_tool_calls_refuses_tools() -> None:
    for chat in (ChatFormat(None, "gemma3"), ChatFormat(None, "llama"), ChatFormat("{{ messages }}", "x")):
        assert chat.tool_format is None
        with pytest.raises(InvalidRequest, match="cannot take tools"):
            chat.render([{"role": "user", "content": "hi"}], [TOOL])
        assert chat.render([{"role": "user", "content": "hi"}])  # without tools it still renders
    assert template_format("{% if tools %}<tool_call>{% endif %}") == "hermes"


# --- what only offered tools and the doubled-brace form change ---------------------------------------
DOUBLED = '<tool_call>\n{{"name": "get_weather", "arguments": {"city": "Paris"}}}}\n</tool_call>'


@pytest.mark.parametrize("pieces", [None, 1, 4], ids=["whole", "by-1", "by-4"])
def test_the_doubled_brace_form_is_a_call(pieces: int | None) -> None:
    """Qwen2.5-Coder copies its template's example, whose braces Jinja doubled, into some of its calls."""
    parsed = parse(f"Checking.\n{DOUBLED}", pieces)
    assert parsed.content == "Checking."
    assert calls(parsed) == [(0, "get_weather", {"city": "Paris"})]
    fenced = '```json\n{{"name": "get_time", "arguments": {"zone": "CET"}}}\n```'
    assert calls(parse(fenced, pieces)) == [(0, "get_time", {"zone": "CET"})]


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ('{{"name": "f"}} trailing', None),  # text after the braces: not a call
        ("{{not json}}", None),
        ('{{{"name": "f"}}}}}', "f"),  # any number of extra braces around one whole call
        ('{{"name": "f", "arguments": {}}', "f"),  # the inner call is whole, an outer brace short
    ],
    ids=["text-after", "not-json", "tripled", "outer-brace-short"],
)
def test_doubled_braces_count_around_one_whole_call(body: str, name: str | None) -> None:
    call = parse_call(body, 0)
    assert (call.name if call else None) == name


@pytest.mark.parametrize("pieces", [None, 1], ids=["whole", "by-1"])
def test_a_call_to_a_function_never_offered_stays_text(pieces: int | None) -> None:
    greet = '<tool_call>\n{"name": "greet", "arguments": {"name": "Bob"}}\n</tool_call>'
    parsed = parse(f"{greet}\n{WEATHER}", pieces)
    assert parsed.content == greet
    assert calls(parsed) == [(0, "get_weather", {"city": "Paris"})]
    assert parse(WEATHER, pieces, offered=()).calls == []  # no tools offered: no calls at all
