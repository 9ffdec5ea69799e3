"""The engine's OpenAI-compatible server as clients meet it: a real subprocess on port 0, real models."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.server_helpers import EngineServer, engine_server, free_port

GEMMA_ARGS = ["--ngram", "--n-ctx", "1024", "--n-threads", "2"]
API_KEY = "test-key-0123456789"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[EngineServer]:
    with engine_server(["--target", str(gemma_path), *GEMMA_ARGS]) as s:
        yield s


@pytest.fixture(scope="module")
def keyed(gemma_path: Path) -> Iterator[EngineServer]:
    """A server that needs the API key, with room for one waiting request."""
    args = ["--target", str(gemma_path), *GEMMA_ARGS, "--queue-size", "1"]
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
    assert props["draft"]["source"] == "ngram"
    assert props["server"]["port"] == server.port


# --- bad input: the right status, and the server keeps serving ---------------------------------------
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "content", "status", "code"),
    [
        (CHAT, b'{"messages": [', 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": USER, "max_tokens": "ten"}).encode(), 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": USER, "max_tokens": -5}).encode(), 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": [], "max_tokens": 4}).encode(), 400, "invalid_request_error"),
        (CHAT, json.dumps({"messages": USER, "n": 2}).encode(), 400, "invalid_request_error"),
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
            deadline = time.monotonic() + 10
            while metrics_with(http)["foresight_queue_depth"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            busy = http.post("/v1/completions", json=small)
            assert busy.status_code == 503
            assert busy.headers["Retry-After"] == "1"
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
    t0 = time.monotonic()
    assert complete(server, max_tokens=2).status_code == 200
    assert time.monotonic() - t0 < 5.0
    generated = (
        metrics(server)["foresight_tokens_generated_total"] - before["foresight_tokens_generated_total"]
    )
    assert generated < 300, "the disconnected stream kept generating"


def test_health_answers_503_while_loading_then_200(gemma_path: Path) -> None:
    port = free_port()
    args = ["--target", str(gemma_path), *GEMMA_ARGS, "--port", str(port)]
    with engine_server(args, wait=False) as s:
        seen: list[tuple[int, str]] = []
        ready = threading.Thread(target=s.wait_ready)
        ready.start()
        while ready.is_alive():
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                seen.append((r.status_code, r.json()["status"]))
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.02)
        assert s.port == port
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


# --- a model with its own chat template -------------------------------------------------------------
def test_qwen_chat_uses_its_own_template(qwen_path: Path) -> None:
    with engine_server(["--target", str(qwen_path), "--no-draft", "--n-ctx", "512", "--n-threads", "2"]) as s:
        props = httpx.get(f"{s.url}/props").json()
        assert props["chat_template"] == "gguf"
        client = OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=120)
        out = client.chat.completions.create(
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
