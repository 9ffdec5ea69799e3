"""Structured output, logprobs, penalties and logit bias through the API, on a real server (gemma-3-270m)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.server.api import CHAT, COMPLETIONS, MESSAGES, RESPONSES, post, sse_events
from tests.support.server_helpers import EngineServer

YES_NO = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": YES_NO, "strict": True}}
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"


def _verdict(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert set(value) == {"answer", "sure"}, text
    assert value["answer"] in ("yes", "no")
    assert isinstance(value["sure"], bool)
    return value


def test_a_json_schema_reply_follows_the_schema(gemma_api: EngineServer) -> None:
    body = {"messages": QUESTION, "response_format": SCHEMA_FORMAT, "max_tokens": 40, "temperature": 0}
    out = post(gemma_api, CHAT, body).json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop"  # the grammar ended the reply when the object closed
    _verdict(choice["message"]["content"])
    assert out["usage"]["speculative"]["draft_source"] == "ngram"


def test_a_streamed_json_schema_reply_equals_the_whole_one(gemma_api: EngineServer) -> None:
    body = {"messages": QUESTION, "response_format": SCHEMA_FORMAT, "max_tokens": 40, "temperature": 0}
    whole = post(gemma_api, CHAT, body).json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", f"{gemma_api.url}{CHAT}", json={**body, "stream": True}, timeout=300) as r:
        events = sse_events(r)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for _, e in events[:-1] if e["choices"])
    assert text == whole
    _verdict(text)


def test_a_sampled_json_object_reply_is_an_object(gemma_api: EngineServer) -> None:
    messages = [{"role": "user", "content": 'Write {"a": 1} as JSON.'}]
    body = {"messages": messages, "response_format": {"type": "json_object"}, "max_tokens": 60}
    for seed in (1, 2):
        choice = post(gemma_api, CHAT, {**body, "temperature": 0.8, "seed": seed}).json()["choices"][0]
        text = choice["message"]["content"]
        assert text.lstrip().startswith("{"), text
        if choice["finish_reason"] == "stop":  # a sampled object may run past max_tokens
            assert isinstance(json.loads(text), dict), text


def test_responses_and_messages_take_a_schema_too(gemma_api: EngineServer) -> None:
    fmt = {"type": "json_schema", "name": "verdict", "schema": YES_NO, "strict": True}
    body = {"input": "Is the sky blue? Answer in JSON.", "text": {"format": fmt}, "temperature": 0}
    out = post(gemma_api, RESPONSES, {**body, "max_output_tokens": 40}).json()
    assert out["status"] == "completed", out
    _verdict(out["output"][0]["content"][0]["text"])
    anthropic = {
        "model": "any",
        "max_tokens": 40,
        "temperature": 0,
        "messages": QUESTION,
        "output_config": {"format": {"type": "json_schema", "schema": YES_NO}},
    }
    message = post(gemma_api, MESSAGES, anthropic).json()
    assert message["stop_reason"] == "end_turn", message
    _verdict(message["content"][0]["text"])


def test_chat_logprobs_come_from_the_target_rows(gemma_api: EngineServer) -> None:
    body = {"messages": QUESTION, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    out = post(gemma_api, CHAT, body).json()
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    assert "".join(t["token"] for t in content) == out["choices"][0]["message"]["content"]
    for token in content:
        assert token["logprob"] <= 0.0
        assert bytes(token["bytes"]).decode("utf-8", errors="replace") == token["token"]
        top = token["top_logprobs"]
        assert len(top) == 3
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["logprob"] == pytest.approx(token["logprob"])  # greedy: the best token was taken
    stream_body = {**body, "stream": True}
    with httpx.stream("POST", f"{gemma_api.url}{CHAT}", json=stream_body, timeout=300) as r:
        events = [e for _, e in sse_events(r)[:-1] if e["choices"]]
    streamed = [
        t for e in events if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["content"]
    ]
    assert [t["token"] for t in streamed] == [t["token"] for t in content]


def test_completion_logprobs_in_the_legacy_shape(gemma_api: EngineServer) -> None:
    body = {"prompt": COUNTING, "max_tokens": 4, "temperature": 0, "logprobs": 2}
    choice = post(gemma_api, COMPLETIONS, body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == 4
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0


@pytest.mark.parametrize(
    ("penalty", "prompt"),
    [({"frequency_penalty": 2.0}, COUNTING), ({"presence_penalty": 2.0}, "apple apple apple apple")],
    ids=["frequency", "presence"],
)
def test_penalties_change_the_greedy_reply(
    gemma_api: EngineServer, penalty: dict[str, float], prompt: str
) -> None:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
    plain = post(gemma_api, COMPLETIONS, body).json()["choices"][0]["text"]
    penalised = post(gemma_api, COMPLETIONS, {**body, **penalty}).json()["choices"][0]["text"]
    # the prompt repeats its tokens: without a penalty the model repeats them too, with one it moves on
    assert penalised != plain


def test_a_logit_bias_of_100_forces_its_token(gemma_api: EngineServer) -> None:
    body = {"prompt": COUNTING, "max_tokens": 3, "temperature": 0, "logprobs": 0}
    baseline = post(gemma_api, COMPLETIONS, body).json()["choices"][0]["logprobs"]["tokens"]
    forced = post(gemma_api, COMPLETIONS, {**body, "logit_bias": {"1000": 100}}).json()["choices"][0]
    tokens = forced["logprobs"]["tokens"]
    assert len(set(tokens)) == 1  # token 1000 every time
    assert tokens != baseline
    banned = post(gemma_api, COMPLETIONS, {**body, "max_tokens": 1, "logit_bias": {"1000": -100}})
    assert banned.status_code == 200


def test_max_completion_tokens_wins_over_max_tokens(gemma_api: EngineServer) -> None:
    for limits, expected in (
        ({"max_tokens": 12, "max_completion_tokens": 2}, 2),
        ({"max_tokens": 2, "max_completion_tokens": 5}, 5),
    ):
        body = {"messages": [{"role": "user", "content": "Count from 1 to 50."}], "temperature": 0, **limits}
        out = post(gemma_api, CHAT, body).json()
        assert out["usage"]["completion_tokens"] <= expected
        assert out["choices"][0]["finish_reason"] == "length", limits


def test_responses_logprobs_ride_on_the_output_text(gemma_api: EngineServer) -> None:
    body = {"input": "Is the sky blue?", "max_output_tokens": 4, "temperature": 0, "top_logprobs": 2}
    out = post(gemma_api, RESPONSES, body).json()
    part = out["output"][0]["content"][0]
    assert "".join(t["token"] for t in part["logprobs"]) == part["text"]
    assert all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in part["logprobs"])


def test_every_text_part_name_reaches_the_template(gemma_api: EngineServer) -> None:
    """Parts named as the Responses API names them are text too, not dropped from the prompt."""
    plain = [{"role": "user", "content": [{"type": "text", "text": "Is the sky blue? Answer yes or no."}]}]
    renamed = [
        {"role": "user", "content": [{"type": "input_text", "text": "Is the sky blue? Answer yes or no."}]}
    ]
    answers = [
        post(gemma_api, CHAT, {"messages": m, "max_tokens": 4, "temperature": 0}).json()
        for m in (plain, renamed)
    ]
    assert answers[0]["usage"]["prompt_tokens"] == answers[1]["usage"]["prompt_tokens"]
    assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
