"""Request fields and bad input on every route: honoured, taken and ignored, or refused by name (gemma)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.server.fields import MAX_STOP, MAX_STOP_CHARS
from tests.server.api import CHAT, COMPLETIONS, MESSAGES, RESPONSES, post, still_serves
from tests.support.server_helpers import EngineServer

USER = [{"role": "user", "content": "hi"}]
ASK = {"messages": USER, "max_tokens": 2, "temperature": 0}
ANTHROPIC = {"model": "any", "max_tokens": 2, "messages": USER, "temperature": 0}
RESPONSE = {"input": "hi", "max_output_tokens": 2, "temperature": 0}
UNCONVERTIBLE = {"type": "string", "pattern": "no anchors"}  # the converter needs ^...$
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}


def _openai_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code", "param"}
    return body["error"]


def _anthropic_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body["type"] == "error"
    assert {"type", "message"} <= set(body["error"])
    return body["error"]


# --- OpenAI routes ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {**ASK, "web_search_options": {}}, "web_search_options"),
        (CHAT, {**ASK, "audio": {"voice": "alloy"}, "functions": []}, "audio"),
        (CHAT, {**ASK, "n": 2}, "n"),
        (CHAT, {**ASK, "modalities": ["text", "audio"]}, "modalities.1"),
        (CHAT, {**ASK, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        (
            CHAT,
            {**ASK, "messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, AUDIO]}]},
            "messages[0].content[1]",
        ),
        (
            CHAT,
            {
                **ASK,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": UNCONVERTIBLE},
                },
            },
            "response_format.json_schema.schema",
        ),
        (CHAT, {**ASK, "response_format": {"type": "yaml"}}, "response_format.type"),
        (CHAT, {**ASK, "logit_bias": {"999999999": 5}}, "logit_bias"),
        (CHAT, {**ASK, "logit_bias": {"a": 5}}, "logit_bias"),
        (CHAT, {**ASK, "top_logprobs": 2}, "top_logprobs"),
        (CHAT, {**ASK, "stop": ["x"] * (MAX_STOP + 1)}, "stop"),
        (CHAT, {**ASK, "stop": ["y" * (MAX_STOP_CHARS + 1)]}, "stop[0]"),
        (COMPLETIONS, {"prompt": "a", "max_tokens": 1, "echo": True}, "echo"),
        (COMPLETIONS, {"prompt": "a", "max_tokens": 1, "logprobs": 6}, "logprobs"),
        (
            COMPLETIONS,
            {"prompt": "a", "max_tokens": 1, "response_format": {"type": "json_object"}},
            "response_format",
        ),
    ],
    ids=[
        "web-search",
        "audio-out",
        "n-2",
        "audio-modality",
        "unknown-role",
        "audio-part",
        "schema-unconvertible",
        "format-type",
        "bias-out-of-vocabulary",
        "bias-key",
        "top-logprobs-alone",
        "stop-count",
        "stop-length",
        "echo",
        "logprobs-6",
        "completions-format",
    ],
)
def test_what_is_not_honoured_is_refused_by_name(
    gemma_api: EngineServer, path: str, body: dict[str, Any], param: str
) -> None:
    response = post(gemma_api, path, body)
    assert response.status_code == 400, response.text
    error = _openai_error(response)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert still_serves(gemma_api)


def test_fields_that_change_nothing_are_taken_and_listed(gemma_api: EngineServer) -> None:
    extras = {
        "user": "u1",
        "metadata": {"a": "b"},
        "store": False,
        "parallel_tool_calls": True,
        "service_tier": "auto",
        "prompt_cache_key": "k",
    }
    assert post(gemma_api, CHAT, {**ASK, **extras}).status_code == 200
    assert (
        post(
            gemma_api, CHAT, {**ASK, "stream_options": {"include_usage": True, "include_obfuscation": False}}
        ).status_code
        == 200
    )
    props = httpx.get(f"{gemma_api.url}/props").json()
    assert set(extras) <= set(props["accepted_ignored"]["/v1/chat/completions"])
    assert "thinking" in props["accepted_ignored"]["/v1/messages"]
    assert "anthropic-beta" in props["accepted_ignored"]["headers"]
    message = post(
        gemma_api,
        MESSAGES,
        {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"}},
        headers={"anthropic-beta": "x", "anthropic-version": "2023-06-01"},
    )
    assert message.status_code == 200, message.text


def test_an_unknown_field_is_named(gemma_api: EngineServer) -> None:
    for path, body in ((CHAT, ASK), (COMPLETIONS, {"prompt": "a", "max_tokens": 1}), (RESPONSES, RESPONSE)):
        response = post(gemma_api, path, {**body, "frobnicate": 1})
        assert response.status_code == 400, (path, response.text)
        error = _openai_error(response)
        assert error["param"] == "frobnicate"
        assert "frobnicate" in error["message"]
    response = post(gemma_api, MESSAGES, {**ANTHROPIC, "frobnicate": 1})
    assert response.status_code == 400
    assert _anthropic_error(response)["param"] == "frobnicate"


# --- the Anthropic route ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "any", "messages": USER}, "max_tokens"),
        ({**ANTHROPIC, "messages": "hi"}, "messages"),
        ({**ANTHROPIC, "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        (
            {**ANTHROPIC, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                **ANTHROPIC,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "18 C"}],
                    }
                ],
            },
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                **ANTHROPIC,
                "messages": [
                    {"role": "assistant", "content": [CALL]},
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "x"}],
                    },
                ],
            },
            "messages[1].content[0].tool_use_id",
        ),
        ({**ANTHROPIC, "system": [{"type": "image", "source": {}}]}, "system[0]"),
        ({**ANTHROPIC, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({**ANTHROPIC, "tool_choice": {"type": "tool", "name": "f"}}, "tool_choice"),
        ({**ANTHROPIC, "stop_sequences": ["z"] * (MAX_STOP + 1)}, "stop_sequences"),
        (
            {**ANTHROPIC, "output_config": {"format": {"type": "json_schema", "schema": UNCONVERTIBLE}}},
            "output_config.format.schema",
        ),
        ({**ANTHROPIC, "mcp_servers": []}, "mcp_servers"),
    ],
    ids=[
        "no-max-tokens",
        "messages-not-a-list",
        "unknown-role",
        "document-block",
        "unknown-tool-use-id",
        "result-for-another-id",
        "system-image",
        "tool-without-schema",
        "tool-choice-without-tools",
        "stop-count",
        "schema-unconvertible",
        "mcp-servers",
    ],
)
def test_bad_messages_bodies_get_anthropic_errors(
    gemma_api: EngineServer, body: dict[str, Any], param: str
) -> None:
    response = post(gemma_api, MESSAGES, body)
    assert response.status_code == 400, response.text
    error = _anthropic_error(response)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert still_serves(gemma_api)


def test_malformed_json_gets_an_anthropic_error(gemma_api: EngineServer) -> None:
    response = httpx.post(
        f"{gemma_api.url}{MESSAGES}", content=b'{"messages": [', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert "not valid JSON" in _anthropic_error(response)["message"]
    missing = httpx.post(f"{gemma_api.url}/v1/messages/nothing", json={})
    assert missing.status_code == 404
    assert _anthropic_error(missing)["type"] == "not_found_error"


def test_count_tokens_counts_the_rendered_prompt(gemma_api: EngineServer) -> None:
    body = {"model": "any", "messages": USER}
    short = post(gemma_api, "/v1/messages/count_tokens?beta=true", body)
    assert short.status_code == 200, short.text
    longer = post(gemma_api, "/v1/messages/count_tokens", {**body, "system": "You are terse. " * 10})
    assert longer.json()["input_tokens"] > short.json()["input_tokens"] > 1
    message = post(gemma_api, f"{MESSAGES}?beta=true", {**ANTHROPIC, **body, "max_tokens": 1})
    assert message.json()["usage"]["input_tokens"] == short.json()["input_tokens"]


# --- the Responses route ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**RESPONSE, "previous_response_id": "resp_1"}, "previous_response_id"),
        (
            {**RESPONSE, "input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
            "input[0].call_id",
        ),
        ({**RESPONSE, "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({**RESPONSE, "input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
        (
            {**RESPONSE, "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        (
            {**RESPONSE, "text": {"format": {"type": "json_schema", "name": "x", "schema": UNCONVERTIBLE}}},
            "text.format.schema",
        ),
        ({**RESPONSE, "truncation": "auto"}, "truncation"),
        ({**RESPONSE, "background": True}, "background"),
        ({**RESPONSE, "tool_choice": "required"}, "tool_choice"),
    ],
    ids=[
        "previous-response",
        "output-for-no-call",
        "item-reference",
        "unknown-role",
        "input-file",
        "schema-unconvertible",
        "truncation-auto",
        "background",
        "required-without-tools",
    ],
)
def test_bad_responses_bodies_are_refused_by_name(
    gemma_api: EngineServer, body: dict[str, Any], param: str
) -> None:
    response = post(gemma_api, RESPONSES, body)
    assert response.status_code == 400, response.text
    assert _openai_error(response)["param"] == param
    assert still_serves(gemma_api)


def test_a_stop_sequence_is_reported_where_it_ended_the_reply(gemma_api: EngineServer) -> None:
    counting = {
        "model": "any",
        "max_tokens": 12,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}],
    }
    free = post(gemma_api, MESSAGES, counting).json()
    text = free["content"][0]["text"]
    assert len(text) > 4, text
    stop = text[2:4]
    out = post(gemma_api, MESSAGES, {**counting, "stop_sequences": ["@@", stop]}).json()
    assert out["stop_reason"] == "stop_sequence"
    assert out["stop_sequence"] == stop
    assert out["content"][0]["text"] == text[: text.index(stop)]
    assert json.dumps(out)  # the whole message is plain JSON
