"""Anthropic's Messages API as Claude Code and the anthropic package use it, on the default model."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.server.api import MESSAGES, post, sse_events
from tests.support.server_helpers import EngineServer

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the city name"}},
        "required": ["city"],
    },
    "cache_control": {"type": "ephemeral"},
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK = {"model": "claude-any", "max_tokens": 48, "temperature": 0, "tools": [WEATHER], "messages": QUESTION}
RESULT = json.dumps({"city": "Paris", "temperature_c": 17, "sky": "light rain"})


def _tool_use(message: dict[str, Any]) -> dict[str, Any]:
    [block] = [b for b in message["content"] if b["type"] == "tool_use"]
    return block


def test_a_tool_use_round_trip(qwen_api: EngineServer) -> None:
    asked = post(qwen_api, f"{MESSAGES}?beta=true", ASK, headers={"anthropic-version": "2023-06-01"}).json()
    assert asked["type"] == "message"
    assert asked["role"] == "assistant"
    assert asked["id"].startswith("msg_")
    assert asked["stop_reason"] == "tool_use", asked
    call = _tool_use(asked)
    assert call["id"].startswith("toolu_")
    assert call["name"] == "get_weather"
    assert call["input"] == {"city": "Paris"}
    assert asked["usage"]["input_tokens"] > 50  # the tools are in the prompt
    history = [
        *QUESTION,
        {"role": "assistant", "content": asked["content"]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call["id"],
                    "content": [{"type": "text", "text": RESULT}],
                },
                {"type": "text", "text": "Answer in one short sentence, without calling tools."},
            ],
        },
    ]
    body = {**ASK, "messages": history, "tool_choice": {"type": "none"}, "max_tokens": 24}
    answered = post(qwen_api, MESSAGES, body).json()
    assert answered["stop_reason"] in ("end_turn", "max_tokens"), answered
    text = answered["content"][0]["text"]
    assert "17" in text or "rain" in text.lower(), text


def test_a_streamed_tool_use_has_every_event_in_order(qwen_api: EngineServer) -> None:
    with httpx.stream("POST", f"{qwen_api.url}{MESSAGES}", json={**ASK, "stream": True}, timeout=300) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] > 50
    assert start["content"] == []
    blocks = [d for n, d in events if n == "content_block_start"]
    assert [b["content_block"]["type"] for b in blocks] == ["tool_use"]
    assert blocks[0]["content_block"]["name"] == "get_weather"
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert [d["index"] for n, d in events if n == "content_block_stop"] == [0]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] > 5


def test_system_blocks_and_text_streams(qwen_api: EngineServer) -> None:
    body = {
        "model": "any",
        "max_tokens": 8,
        "temperature": 0,
        "system": [
            {"type": "text", "text": "Reply with just the number.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}],
    }
    whole = post(qwen_api, MESSAGES, body).json()
    assert "4" in whole["content"][0]["text"]
    with httpx.stream("POST", f"{qwen_api.url}{MESSAGES}", json={**body, "stream": True}, timeout=300) as r:
        events = sse_events(r)
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == whole["content"][0]["text"]
    assert [d["content_block"]["type"] for n, d in events if n == "content_block_start"] == ["text"]


def test_a_named_tool_choice_forces_that_tool(qwen_api: EngineServer) -> None:
    body = {
        **ASK,
        "messages": [{"role": "user", "content": "Hello there!"}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    out = post(qwen_api, MESSAGES, body).json()
    assert out["stop_reason"] == "tool_use", out
    call = _tool_use(out)
    assert call["name"] == "get_weather"
    assert isinstance(call["input"].get("city"), str)


def test_anthropic_tool_types_are_dropped_and_named(qwen_api: EngineServer) -> None:
    tools = [WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]
    response = post(qwen_api, MESSAGES, {**ASK, "tools": tools})
    assert response.status_code == 200, response.text
    assert response.headers["x-foresight-dropped-tools"] == "web_search"
    assert _tool_use(response.json())["name"] == "get_weather"
