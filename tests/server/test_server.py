# Over 500 lines: the OpenAI routes as clients meet them share one server per model, started once.
"""The engine's OpenAI-compatible server as clients meet it: a real subprocess on port 0, real models."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.support.server_helpers import EngineServer, engine_server, free_port

GEMMA_ARGS = ["--ngram", "--n-ctx", "1024", "--n-threads", "2"]
API_KEY = "test-key-0123456789"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[EngineServer]:
    with engine_server(["--target", str(gemma_path), *GEMMA_ARGS]) as s:
        yield s


@pytest.fixture(scope="module")
def keyed(gemma_path: Path) -> Iterator[EngineServer]:
    """A server that needs the API key, runs one request at a time and has room for one waiting."""
    args = ["--target", str(gemma_path), *GEMMA_ARGS, "--slots", "1", "--queue-size", "1"]
    with engine_server(args, env={"FORESIGHT_API_KEY": API_KEY}) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: EngineServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


def complete(server: EngineServer, **body: Any) -> httpx.Response:
    body = {"prompt": COUNTING, "max_tokens": 4, "temperature": 0, **body}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)


def metrics(server: EngineServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    rows = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in rows}


def error_code(response: httpx.Response) -> str:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "code", "param"}
    return body["error"]["code"]


# --- the happy paths --------------------------------------------------------------------------------
def test_chat_completion(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None
    assert 1 <= out.usage.completion_tokens <= 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    speculative = out.usage.model_extra["speculative"]
    assert speculative["draft_source"] == "ngram"
    assert speculative["emitted"] == out.usage.completion_tokens


def test_chat_stream_equals_non_stream_at_temperature_0(client: OpenAI) -> None:
    messages = [{"role": "user", "content": "Count from one to ten in words."}]
    whole = client.chat.completions.create(model="any", messages=messages, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(
        model="any",
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    flags = [f for c in chunks for f in c.model_extra["speculative_tokens"]]
    assert all(isinstance(f, bool) for f in flags)
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert len(flags) == usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunk.usage.model_extra["speculative"]["accepted"] >= sum(flags)


def test_text_completion_and_stream(client: OpenAI) -> None:
    out = client.completions.create(model="any", prompt=COUNTING, max_tokens=6, temperature=0)
    assert out.object == "text_completion"
    assert out.choices[0].text
    assert out.usage is not None
    assert out.usage.model_extra["speculative"]["draft_source"] == "ngram"
    pieces = list(
        client.completions.create(model="any", prompt=COUNTING, max_tokens=6, temperature=0, stream=True)
    )
    assert "".join(p.choices[0].text for p in pieces) == out.choices[0].text
    assert pieces[-1].choices[0].finish_reason == out.choices[0].finish_reason


def test_models_lists_the_loaded_model(client: OpenAI, gemma_path: Path) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [gemma_path.stem]
    assert models[0].model_extra["context_length"] == 1024
    assert models[0].model_extra["draft"] == "ngram"


def test_a_stop_string_ends_the_text_before_it(client: OpenAI) -> None:
    free = client.completions.create(model="any", prompt=COUNTING, max_tokens=16, temperature=0).choices[0]
    assert len(free.text) > 6, free.text
    stop = free.text[3:6]
    out = client.completions.create(model="any", prompt=COUNTING, max_tokens=16, temperature=0, stop=[stop])
    assert out.choices[0].text == free.text[: free.text.index(stop)]
    assert out.choices[0].finish_reason == "stop"


def test_same_seed_same_sampled_text(client: OpenAI) -> None:
    def sample(seed: int) -> str:
        out = client.completions.create(
            model="any", prompt="Once upon a time", max_tokens=12, temperature=0.8, seed=seed
        )
        return out.choices[0].text

    assert sample(1234) == sample(1234)


def test_metrics_count_requests_and_tokens(server: EngineServer) -> None:
    before = metrics(server)
    usage = complete(server, max_tokens=5).json()["usage"]
    after = metrics(server)
    assert after["foresight_requests_total"] == before["foresight_requests_total"] + 1
    generated = after["foresight_tokens_generated_total"] - before["foresight_tokens_generated_total"]
    assert generated == usage["completion_tokens"]
    assert after["foresight_drafted_tokens_total"] >= after["foresight_accepted_tokens_total"]
    assert "foresight_last_tokens_per_second" in after


def test_props_and_health(server: EngineServer) -> None:
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    props = httpx.get(f"{server.url}/props").json()
    assert props["chat_template"] == "fallback:gemma"
    assert props["capabilities"] == {"tools": False, "tool_call_format": None, "fill_in_the_middle": False}
    assert props["draft"]["source"] == "ngram"
    assert props["server"]["port"] == server.port
    target = props["target"]  # the placement the engine runs with
    assert target["device"] == "cpu"
    assert target["gpu_layers"] == 0
    assert target["n_layer"] == 18
    assert target["tensor_split"] is None
    assert target["device_reason"]


# --- bad input: the right status, and the server keeps serving ---------------------------------------
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
INVALID = "invalid_request_error"
TOOL_F = {"type": "function", "function": {"name": "f"}}
CHOOSE_F = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(
    ("path", "content", "status", "code"),
    [
        (CHAT, b'{"messages": [', 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": USER, "max_tokens": "ten"}).encode(), 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": USER, "max_tokens": -5}).encode(), 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": [], "max_tokens": 4}).encode(), 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": USER, "n": 2}).encode(), 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": USER, "tools": [{"type": "function"}]}).encode(), 400, INVALID),
        (CHAT, json.dumps({"messages": USER, "tool_choice": CHOOSE_F}).encode(), 400, INVALID),
        ("/v1/completions", json.dumps({"prompt": "word " * 3000}).encode(), 400, "context_length_exceeded"),
        ("/v1/completions", b'{"prompt": "' + b"x" * (3 << 20) + b'"}', 413, "request_too_large"),
        ("/v1/nothing-here", b"{}", 404, "not_found"),
    ],
    ids=[
        "malformed-json",
        "wrong-type",
        "negative-max-tokens",
        "empty-messages",
        "n-2",
        "tool-without-function",
        "tool-choice-without-tools",
        "over-context",
        "3mb-body",
        "unknown-route",
    ],
)
def test_bad_input_is_refused_and_the_server_keeps_serving(
    server: EngineServer, path: str, content: bytes, status: int, code: str
) -> None:
    headers = {"Content-Type": "application/json"}
    response = httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=60)
    assert response.status_code == status, response.text
    assert error_code(response) == code
    assert complete(server, max_tokens=1).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "message", "fine"),
    [
        (
            "/v1/completions",
            {"prompt": "def f(", "suffix": "\n"},
            "does not support fill-in-the-middle",
            {"suffix": ""},  # nothing after the gap: a plain completion
        ),
        (CHAT, {"messages": USER, "tools": [TOOL_F]}, "cannot take tools", {"tool_choice": "none"}),
    ],
    ids=["suffix", "tools"],
)
def test_what_the_model_cannot_do_is_refused(
    server: EngineServer, path: str, body: dict[str, Any], message: str, fine: dict[str, Any]
) -> None:
    response = httpx.post(f"{server.url}{path}", json={**body, "max_tokens": 2}, timeout=60)
    assert response.status_code == 400, response.text
    assert error_code(response) == "invalid_request_error"
    assert message in response.json()["error"]["message"]
    plain = {**body, "max_tokens": 2, **fine}
    assert httpx.post(f"{server.url}{path}", json=plain, timeout=60).status_code == 200


ONE_PIXEL_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def test_an_image_for_a_model_without_vision_is_refused_by_name(server: EngineServer) -> None:
    png = "data:image/png;base64," + base64.b64encode(ONE_PIXEL_PNG).decode()
    parts = [{"type": "text", "text": "What is in it?"}, {"type": "image_url", "image_url": {"url": png}}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 2}
    response = httpx.post(f"{server.url}{CHAT}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert error_code(response) == "model_has_no_vision"
    assert response.json()["error"]["param"] == "messages[0].content[1]"
    text_only = {"messages": [{"role": "user", "content": parts[:1]}], "max_tokens": 2}
    assert httpx.post(f"{server.url}{CHAT}", json=text_only, timeout=60).status_code == 200


def test_a_foreign_host_header_is_refused(server: EngineServer) -> None:
    response = httpx.get(f"{server.url}/v1/models", headers={"Host": "evil.example:80"})
    assert response.status_code == 400
    assert error_code(response) == "invalid_host"
    ok = httpx.get(f"{server.url}/v1/models", headers={"Host": f"localhost:{server.port}"})
    assert ok.status_code == 200


def test_the_api_key_is_required_when_set(keyed: EngineServer) -> None:
    url = f"{keyed.url}/v1/models"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.get(url, headers=headers)
        assert response.status_code == 401
        assert error_code(response) == "unauthorized"
    assert httpx.get(f"{keyed.url}/health").status_code == 200
    client = OpenAI(base_url=f"{keyed.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    out = client.completions.create(model="any", prompt=COUNTING, max_tokens=2, temperature=0)
    assert out.choices[0].text


def test_a_full_queue_answers_busy(keyed: EngineServer) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    body = {"prompt": COUNTING, "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.Client(base_url=keyed.url, headers=auth, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as running:
            assert running.status_code == 200  # headers come with the first chunk: the job is running
            small = {"prompt": COUNTING, "max_tokens": 2, "temperature": 0}
            waiting = threading.Thread(target=http.post, args=("/v1/completions",), kwargs={"json": small})
            waiting.start()
            deadline = time.monotonic() + 60
            while metrics_with(http)["foresight_queue_depth"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert metrics_with(http)["foresight_queue_depth"] == 1  # one running (one slot), one waiting
            busy = http.post("/v1/completions", json=small)
            assert busy.status_code == 503
            assert int(busy.headers["Retry-After"]) >= 1  # computed from the queue (server/admission.py)
            assert error_code(busy) == "server_busy"
        waiting.join(60)  # the waiting stream runs once the first one is closed (cancelled)


def metrics_with(http: httpx.Client) -> dict[str, float]:
    rows = (line.split() for line in http.get("/metrics").text.splitlines() if line and line[0] != "#")
    return {name: float(value) for name, value in rows}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "FORESIGHT_API_KEY"),  # a LAN listener needs a key
        ([], "no such model file"),  # loading fails: no READY, a clear error, exit 2
    ],
    ids=["lan-without-key", "missing-model"],
)
def test_the_server_refuses_to_start(tmp_path: Path, args: list[str], message: str) -> None:
    with engine_server(["--target", str(tmp_path / "missing.gguf"), *args], wait=False) as s:
        with pytest.raises(AssertionError, match="exited"):
            s.wait_ready(60)
        assert s.wait_exit() == 2
        assert message in s.log_tail()


# --- disconnects and crashes ------------------------------------------------------------------------
def test_a_client_disconnect_cancels_the_generation(server: EngineServer) -> None:
    before = metrics(server)
    body = {"prompt": COUNTING, "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert next(lines) == ""
    assert complete(server, max_tokens=2).status_code == 200  # the engine was free again
    generated = (
        metrics(server)["foresight_tokens_generated_total"] - before["foresight_tokens_generated_total"]
    )
    assert generated < 300, "the disconnected stream kept generating"


def test_health_answers_503_while_loading_then_200(gemma_path: Path) -> None:
    port = free_port()
    args = ["--target", str(gemma_path), *GEMMA_ARGS, "--port", str(port)]
    with engine_server(args, wait=False) as s:
        seen: list[tuple[int, str]] = []
        early: list[httpx.Response] = []  # completions asked for while loading
        ready = threading.Thread(target=s.wait_ready)
        ready.start()
        while ready.is_alive():
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                seen.append((r.status_code, r.json()["status"]))
                if r.status_code == 503 and not early:
                    body = {"prompt": "1, 2,", "max_tokens": 2}
                    early.append(httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=5))
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.02)
        assert s.port == port
        for r in early:
            if r.status_code == 503:  # (the load may have finished in between)
                assert r.json()["error"]["code"] == "model_not_loaded"
                assert r.headers["retry-after"] == "2"
        final = httpx.get(f"{s.url}/health")
        assert (final.status_code, final.json()) == (200, {"status": "ok"})
        assert set(seen) <= {(503, "loading"), (200, "ok")}
        assert seen == sorted(seen, key=lambda pair: pair[0] == 200), "health went back to 503"


def test_kill_9_gives_waiting_clients_a_connection_error(gemma_path: Path) -> None:
    with engine_server(["--target", str(gemma_path), *GEMMA_ARGS]) as s:
        body = {"prompt": COUNTING, "max_tokens": 900, "temperature": 0}
        errors: list[BaseException] = []

        def wait_for_answer() -> None:
            try:
                httpx.post(f"{s.url}/v1/completions", json=body, timeout=30)
            except httpx.TransportError as exc:
                errors.append(exc)

        with httpx.stream("POST", f"{s.url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            waiting = threading.Thread(target=wait_for_answer)
            waiting.start()
            time.sleep(0.3)
            t0 = time.monotonic()
            s.proc.kill()
            with pytest.raises(httpx.TransportError):
                for _ in lines:
                    pass
            waiting.join(30)
            assert not waiting.is_alive()
            assert len(errors) == 1
            assert time.monotonic() - t0 < 10


# --- a model with its own chat template: Qwen2.5-Coder-1.5B-Instruct, one server for these tests -----
@pytest.fixture(scope="module")
def qwen(qwen_path: Path) -> Iterator[EngineServer]:
    args = ["--target", str(qwen_path), "--no-draft", "--n-ctx", "1024", "--n-threads", "2"]
    with engine_server(args) as s:
        yield s


@pytest.fixture(scope="module")
def qwen_client(qwen: EngineServer) -> OpenAI:
    return OpenAI(base_url=f"{qwen.url}/v1", api_key="x", max_retries=0, timeout=300)


def test_qwen_chat_uses_its_own_template(qwen: EngineServer, qwen_client: OpenAI) -> None:
    props = httpx.get(f"{qwen.url}/props").json()
    assert props["chat_template"] == "gguf"
    assert props["capabilities"] == {"tools": True, "tool_call_format": "hermes", "fill_in_the_middle": True}
    out = qwen_client.chat.completions.create(
        model="any",
        messages=[
            {"role": "system", "content": "Reply with just the number."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert "4" in out.choices[0].message.content
    assert out.usage is not None
    assert out.usage.prompt_tokens > 10  # the template's system and turn markers
    assert out.usage.model_extra["speculative"]["draft_source"] == "none"


def test_a_second_chat_turn_reuses_the_first_turns_kv(qwen_client: OpenAI) -> None:
    turn = [{"role": "user", "content": "Name a prime number."}]
    first = qwen_client.chat.completions.create(model="any", messages=turn, max_tokens=4, temperature=0)
    reply = {"role": "assistant", "content": first.choices[0].message.content}
    turn += [reply, {"role": "user", "content": "And another one?"}]
    second = qwen_client.chat.completions.create(model="any", messages=turn, max_tokens=2, temperature=0)
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the whole first prompt (and what was generated after it) was still in the KV cache
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    assert second.usage.model_extra["speculative"]["reused_tokens"] == cached


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city name"}},
            "required": ["city"],
        },
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_RESULT = json.dumps({"city": "Paris", "temperature_c": 17, "sky": "light rain"})


def with_tool_result(call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    """The question, the assistant's call as OpenAI clients send it back, and the tool's answer."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        *WEATHER_QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": WEATHER_RESULT},
    ]


def mentions_the_result(answer: str) -> bool:
    return "17" in answer or "rain" in answer.lower()


def test_a_tool_call_round_trip(qwen_client: OpenAI) -> None:
    asked = qwen_client.chat.completions.create(
        model="any", messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], max_tokens=40, temperature=0
    )
    choice = asked.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # no markup leaks into the text
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    # tool_choice "none": answer from the result (this 1.5B model would otherwise call again)
    answered = qwen_client.chat.completions.create(
        model="any",
        messages=with_tool_result(call.id, call.function.name, call.function.arguments),
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=12,
        temperature=0,
    )
    assert answered.choices[0].message.tool_calls is None
    assert mentions_the_result(answered.choices[0].message.content), answered.choices[0].message.content


def test_a_tool_call_round_trip_streamed(qwen_client: OpenAI) -> None:
    stream = qwen_client.chat.completions.create(
        model="any",
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == ""  # nothing of the call's markup was streamed as text
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:  # assembled as OpenAI clients do: by index, arguments concatenated
        call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
        call["id"] = d.id or call["id"]
        call["name"] += d.function.name or ""
        call["arguments"] += d.function.arguments or ""
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_")
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]

    stream = qwen_client.chat.completions.create(
        model="any",
        messages=with_tool_result(calls[0]["id"], calls[0]["name"], calls[0]["arguments"]),
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    answer = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert mentions_the_result(answer), answer


def test_fill_in_the_middle_with_a_suffix(qwen_client: OpenAI) -> None:
    out = qwen_client.completions.create(
        model="any",
        prompt="def add(a, b):\n    return ",
        suffix="\n\n\nprint(add(2, 3))\n",
        max_tokens=8,
        temperature=0,
    )
    assert out.choices[0].text.strip() == "a + b"
    assert out.choices[0].finish_reason == "stop"
