"""The three dialects' replies, streamed and whole, byte for byte as recorded (ids and timings aside).

tests/server/golden/replies.json holds what a plain-decoding server answered to REQUESTS; a change that only
moves code must answer the same bytes. After a change that means to alter a reply, record anew with
`FORESIGHT_RECORD_REPLIES=1 python -m pytest tests/server/test_stream_bytes.py` and read the diff.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server_helpers import EngineServer, engine_server

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "golden" / "replies.json"
RECORD = os.environ.get("FORESIGHT_RECORD_REPLIES") == "1"

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city's name"}},
    "required": ["city"],
}
ASK_WEATHER = "What is the weather in Paris right now? Use the tool."
ASK_CODE = "Write a Python function that returns the square of x."
OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": WEATHER,
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": WEATHER,
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": WEATHER,
}
USER = [{"role": "user", "content": ASK_CODE}]
WEATHER_USER = [{"role": "user", "content": ASK_WEATHER}]
STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}

# name -> (path, body); asked in this order of one fresh server (prefixes kept between them are part of it)
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": USER, "max_tokens": 16, "temperature": 0}),
    "chat_stream": (
        "/v1/chat/completions",
        {"messages": USER, "max_tokens": 16, "temperature": 0, **STREAM_USAGE},
    ),
    "chat_tool_stream": (
        "/v1/chat/completions",
        {
            "messages": WEATHER_USER,
            "tools": [OPENAI_TOOL],
            "max_tokens": 48,
            "temperature": 0,
            **STREAM_USAGE,
        },
    ),
    "completion_stream": (
        "/v1/completions",
        {"prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0, **STREAM_USAGE},
    ),
    "messages": ("/v1/messages", {"messages": USER, "max_tokens": 16, "temperature": 0}),
    "messages_stream": (
        "/v1/messages",
        {"messages": USER, "max_tokens": 16, "temperature": 0, "stream": True},
    ),
    "messages_tool_stream": (
        "/v1/messages",
        {
            "messages": WEATHER_USER,
            "tools": [ANTHROPIC_TOOL],
            "max_tokens": 48,
            "temperature": 0,
            "stream": True,
        },
    ),
    "responses": ("/v1/responses", {"input": ASK_CODE, "max_output_tokens": 16, "temperature": 0}),
    "responses_stream": (
        "/v1/responses",
        {"input": ASK_CODE, "max_output_tokens": 16, "temperature": 0, "stream": True},
    ),
    "responses_tool_stream": (
        "/v1/responses",
        {
            "input": ASK_WEATHER,
            "tools": [RESPONSES_TOOL],
            "max_output_tokens": 48,
            "temperature": 0,
            "stream": True,
        },
    ),
}

_IDS = re.compile(r"\b(chatcmpl-|cmpl-|msg_|resp_|call_|toolu_|fc_)[0-9a-f]{24}\b")
_CLOCK = re.compile(r'"(created|created_at)": ?\d+')
_TIMES = re.compile(r'"time_s": ?\{[^{}]*\}')
_RATE = re.compile(r'"tokens_per_second": ?[-0-9.e+]+')
_HEARTBEAT = re.compile(r"^: [^\n]*\n\n", re.MULTILINE)  # keep-alive comments come after silences


def normalized(text: str) -> str:
    """The reply with its ids, clock readings, timings and keep-alive comments replaced by placeholders."""
    text = _IDS.sub(r"\1<id>", text)
    text = _CLOCK.sub(r'"\1": 0', text)
    text = _TIMES.sub('"time_s": {}', text)
    text = _RATE.sub('"tokens_per_second": 0', text)
    return _HEARTBEAT.sub("", text)


@pytest.fixture(scope="module")
def plain_qwen(qwen_path: Path) -> Iterator[EngineServer]:
    """The default model decoding plainly: one token a piece, so that the replies do not depend on timing."""
    args = ["--target", str(qwen_path), "--no-draft", "--n-ctx", "2048", "--n-threads", "2", "--slots", "1"]
    with engine_server(args) as server:
        yield server


def _ask(server: EngineServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with (
        httpx.Client(base_url=server.url, timeout=300) as client,
        client.stream("POST", path, json=body) as response,
    ):
        raw = b"".join(response.iter_bytes())
    return {
        "status": response.status_code,
        "content_type": response.headers.get("content-type"),
        "body": normalized(raw.decode("utf-8")),
    }


def test_replies_are_byte_identical_to_the_recorded_ones(plain_qwen: EngineServer) -> None:
    replies = {name: _ask(plain_qwen, path, body) for name, (path, body) in REQUESTS.items()}
    for name, reply in replies.items():
        assert reply["status"] == 200, f"{name}: {reply['body'][:500]}"
    if RECORD:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(replies, indent=1, ensure_ascii=False) + "\n")
        pytest.skip(f"recorded {GOLDEN}")
    recorded = json.loads(GOLDEN.read_text())
    assert list(replies) == list(recorded)
    for name in replies:
        assert replies[name] == recorded[name], name


def test_the_normalizer_keeps_everything_but_ids_and_timings() -> None:
    raw = (
        'data: {"id": "chatcmpl-0123456789abcdef01234567", "created": 1764000000, "x": "call_"}\n\n'
        ": waiting for the model\n\n"
        'data: {"usage": {"time_s": {"prefill": 0.1, "draft": 0.0}, "tokens_per_second": 12.5, "n": 3}}\n\n'
    )
    assert normalized(raw) == (
        'data: {"id": "chatcmpl-<id>", "created": 0, "x": "call_"}\n\n'
        'data: {"usage": {"time_s": {}, "tokens_per_second": 0, "n": 3}}\n\n'
    )
