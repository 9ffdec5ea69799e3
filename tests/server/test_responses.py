"""OpenAI's Responses API as Codex and the openai package use it, checked against the package's own types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.server.api import RESPONSES, post, sse_events
from tests.support.server_helpers import EngineServer

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
ASK = {
    "model": "any",
    "input": "What is the weather in Paris?",
    "tools": [WEATHER],
    "temperature": 0,
    "max_output_tokens": 48,
}
RESULT = json.dumps({"city": "Paris", "temperature_c": 17, "sky": "light rain"})
EVENTS = TypeAdapter(ResponseStreamEvent)


def _call(response: dict[str, Any]) -> dict[str, Any]:
    [call] = [item for item in response["output"] if item["type"] == "function_call"]
    return call


def test_a_function_call_round_trip(qwen_api: EngineServer) -> None:
    asked = post(qwen_api, RESPONSES, {**ASK, "tools": [WEATHER, {"type": "local_shell"}]})
    assert asked.headers["x-foresight-dropped-tools"] == "local_shell"
    out = Response.model_validate(asked.json())
    assert out.status == "completed"
    call = _call(asked.json())
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["call_id"].startswith("call_")
    history = [
        {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
        {
            "type": "function_call",
            "call_id": call["call_id"],
            "name": call["name"],
            "arguments": call["arguments"],
        },
        {"type": "function_call_output", "call_id": call["call_id"], "output": RESULT},
    ]
    body = {
        **ASK,
        "input": history,
        "tool_choice": "none",
        "max_output_tokens": 24,
        "instructions": "Be brief.",
    }
    answered = Response.model_validate(post(qwen_api, RESPONSES, body).json())
    assert "17" in answered.output_text or "rain" in answered.output_text.lower(), answered.output_text


def test_the_stream_is_the_packages_event_list(qwen_api: EngineServer) -> None:
    with httpx.stream("POST", f"{qwen_api.url}{RESPONSES}", json={**ASK, "stream": True}, timeout=300) as r:
        events = sse_events(r)
    parsed = [EVENTS.validate_python(data) for _, data in events]  # each is one of openai's event types
    kinds = [e.type for e in parsed]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert all(name == data["type"] for name, data in events)
    assert "response.function_call_arguments.delta" in kinds
    done = parsed[-1].response
    [call] = [item for item in done.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert done.usage is not None
    assert done.usage.output_tokens > 5


def test_text_streams_through_the_openai_client(qwen_api: EngineServer) -> None:
    client = OpenAI(base_url=f"{qwen_api.url}/v1", api_key="x", max_retries=0, timeout=300)
    kwargs: dict[str, Any] = {"model": "any", "instructions": "Reply with just the number.", "temperature": 0}
    whole = client.responses.create(input="What is 2+2?", max_output_tokens=8, **kwargs)
    assert "4" in whole.output_text
    with client.responses.stream(input="What is 2+2?", max_output_tokens=8, **kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == whole.output_text
    assert kinds.count("response.output_text.done") == 1
    assert "response.content_part.added" in kinds


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_call_names_an_offered_function(qwen_api: EngineServer, choice: Any) -> None:
    body = {**ASK, "input": "Say hello to Bob.", "tool_choice": choice}
    call = _call(post(qwen_api, RESPONSES, body).json())
    assert call["name"] == "get_weather"
    assert isinstance(json.loads(call["arguments"])["city"], str)
