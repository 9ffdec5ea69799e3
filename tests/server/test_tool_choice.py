"""Chat completions' tool calls on the default model: only offered functions, OpenAI's streamed deltas."""

from __future__ import annotations

import json

from openai import OpenAI

from tests.support.server_helpers import EngineServer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
GREETING = [{"role": "user", "content": "Say hello to Bob."}]


def _client(server: EngineServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)


def test_a_required_call_is_to_an_offered_function(qwen_api: EngineServer) -> None:
    """A greeting with only get_weather offered once came back as a call to `greet`, never offered."""
    out = _client(qwen_api).chat.completions.create(
        model="any", messages=GREETING, tools=[WEATHER], tool_choice="required", max_tokens=40, temperature=0
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_a_streamed_call_names_itself_first_with_empty_arguments(qwen_api: EngineServer) -> None:
    stream = _client(qwen_api).chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    deltas = [d for c in stream if c.choices for d in c.choices[0].delta.tool_calls or []]
    first = deltas[0]
    assert first.id.startswith("call_")
    assert first.type == "function"
    assert first.function.name == "get_weather"
    assert first.function.arguments == ""
    assert all(d.index == 0 for d in deltas)
    assert all(d.function.name is None and d.id is None for d in deltas[1:])
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
