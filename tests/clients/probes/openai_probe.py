"""Run by the openai client's own venv: chat, stream, tools, .parse() and logprobs; prints what came back."""

from __future__ import annotations

import json
import sys

from openai import OpenAI
from pydantic import BaseModel

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class Person(BaseModel):
    name: str
    age: int


def main(base_url: str) -> dict[str, object]:
    client = OpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=900)
    sums = [
        {"role": "system", "content": "Reply with just the number."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    chat = client.chat.completions.create(model="qwen", messages=sums, max_tokens=8, temperature=0, seed=7)
    stream = client.chat.completions.create(
        model="qwen", messages=sums, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = client.chat.completions.create(
        model="qwen", messages=weather, tools=[WEATHER], max_tokens=48, temperature=0
    )
    [call] = tools.choices[0].message.tool_calls or []
    record = [{"role": "user", "content": "Ann Lee is 31 years old. Give her record."}]
    parsed = client.chat.completions.parse(
        model="qwen", messages=record, response_format=Person, max_tokens=40, temperature=0
    )
    person = parsed.choices[0].message.parsed
    logprobs = client.chat.completions.create(
        model="qwen", messages=sums, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = logprobs.choices[0].logprobs.content if logprobs.choices[0].logprobs else []
    return {
        "chat": chat.choices[0].message.content,
        "stream": streamed,
        "tool_call": {
            "id": call.id,
            "name": call.function.name,
            "arguments": json.loads(call.function.arguments),
        },
        "finish_reason": tools.choices[0].finish_reason,
        "parsed": person.model_dump() if person else None,
        "logprobs": [{"token": t.token, "logprob": t.logprob, "top": len(t.top_logprobs)} for t in content],
        "logprob_text": logprobs.choices[0].message.content,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
