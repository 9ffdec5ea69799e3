"""Run by the anthropic client's own venv: messages, stream, tools, token count; prints what came back."""

from __future__ import annotations

import json
import sys

import anthropic

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SUMS = [{"role": "user", "content": "What is 2+2?"}]
SYSTEM = "Reply with just the number."


def main(base_url: str) -> dict[str, object]:
    client = anthropic.Anthropic(base_url=base_url, api_key="local", max_retries=0, timeout=900)
    message = client.messages.create(model="qwen", system=SYSTEM, messages=SUMS, max_tokens=8)
    with client.messages.stream(model="qwen", system=SYSTEM, messages=SUMS, max_tokens=8) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = client.messages.create(model="qwen", messages=weather, tools=[WEATHER], max_tokens=48)
    [use] = [b for b in tools.content if b.type == "tool_use"]
    with client.messages.stream(model="qwen", messages=weather, tools=[WEATHER], max_tokens=48) as s:
        streamed_use = [b for b in s.get_final_message().content if b.type == "tool_use"]
    count = client.messages.count_tokens(model="qwen", system=SYSTEM, messages=SUMS)
    return {
        "text": "".join(b.text for b in message.content if b.type == "text"),
        "stop_reason": message.stop_reason,
        "stream": streamed,
        "stream_stop_reason": final.stop_reason,
        "input_tokens": message.usage.input_tokens,
        "tool_use": {"id": use.id, "name": use.name, "input": use.input},
        "tool_stop_reason": tools.stop_reason,
        "streamed_tool_use": [{"name": b.name, "input": b.input} for b in streamed_use],
        "count_tokens": count.input_tokens,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
