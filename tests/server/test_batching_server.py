"""Many clients against the real server (gemma-3-270m, CPU, n-gram drafting): concurrent streams decoded in
one batch give each its solo text, a queued client that left costs no prefill, and a seed gives the same
text whatever the KV cache held."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli.bench import NEAR_TIE
from tests.support.server_helpers import EngineServer, engine_server

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"
QUESTIONS = [
    "Count from one to twenty in words.",
    "List the days of the week.",
    "Write a Python function that adds two numbers.",
    "Name the colours of the rainbow.",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
    "What is the capital of France?",
    "Write the alphabet in capitals, separated by commas.",
    "Say hello in five languages.",
]


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[EngineServer]:
    args = ["--target", str(gemma_path), "--ngram", "--n-ctx", "2048", "--n-threads", "2", "--n-batch", "64"]
    with engine_server([*args, "--queue-size", "16"]) as s:
        yield s


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def gauges(http: httpx.Client) -> dict[str, float]:
    rows = (line.split() for line in http.get("/metrics").text.splitlines() if line and line[0] != "#")
    return {name: float(value) for name, value in rows}


def _chat(http: httpx.Client, question: str) -> list[dict[str, Any]]:
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 32,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["content"]


def test_eight_concurrent_clients_get_their_solo_text(server: EngineServer) -> None:
    with httpx.Client(base_url=server.url, timeout=300) as http:
        solo = [_chat(http, q) for q in QUESTIONS]
        steps_before = http.get("/props").json()["batching"]["batch_steps"]

        def ask(question: str) -> list[dict[str, Any]]:
            with httpx.Client(base_url=server.url, timeout=300) as own:
                return _chat(own, question)

        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            together = list(pool.map(ask, QUESTIONS))
        props = http.get("/props").json()["batching"]
        assert props["batched"] is True
        assert props["batch_steps"] > steps_before  # they did share decode passes
        for alone, batched in zip(solo, together, strict=True):
            a, b = [t["token"] for t in alone], [t["token"] for t in batched]
            diff = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
            if diff is None:
                assert a == b
                continue
            top = alone[diff]["top_logprobs"]
            margin = top[0]["logprob"] - top[1]["logprob"]  # a logprob gap is the logit gap
            assert margin < NEAR_TIE, f"outputs part at token {diff} where the top-2 margin is {margin:.3f}"
        assert gauges(http)["foresight_requests_failed_total"] == 0


def _post_and_leave(port: int, body: bytes) -> socket.socket:
    """A client that sends a completion request and will hang up without reading the answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_a_queued_client_that_left_costs_no_prefill(server: EngineServer) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as http:
        counted = http.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 1}).json()
        busy_prompt = counted["usage"]["prompt_tokens"]
        before = gauges(http)
        # max_tokens past the context: this stream reserves every KV cell, so the next jobs wait
        body = {"prompt": COUNTING, "max_tokens": 4096, "temperature": 0, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as busy:
            lines = busy.iter_lines()
            assert next(lines).startswith("data: ")
            waiting = (
                b'{"prompt": "' + b"A long prompt that must never be read. " * 40 + b'", "max_tokens": 8}'
            )
            leavers = [_post_and_leave(server.port or 0, waiting) for _ in range(2)]
            # both wait: one taken in for want of KV room, one still queued behind it
            assert wait_for(lambda: gauges(http)["foresight_queue_depth"] == 2)
            for sock in leavers:
                sock.close()
            for _ in range(40):  # the stream goes on a while after the clients hung up
                next(lines)
        dropped = before["foresight_jobs_dropped_total"] + 2
        assert wait_for(lambda: gauges(http)["foresight_jobs_dropped_total"] >= dropped)
        assert wait_for(lambda: gauges(http)["foresight_queue_depth"] == 0)
        after = gauges(http)
        assert after["foresight_jobs_dropped_total"] == before["foresight_jobs_dropped_total"] + 2
        # only the busy stream's prompt was read; the two that left cost nothing
        assert after["foresight_prompt_tokens_total"] - before["foresight_prompt_tokens_total"] == busy_prompt
        assert after["foresight_requests_failed_total"] == before["foresight_requests_failed_total"]


N_BATCH = 64  # the server's prompt passes: a seeded request reuses only whole passes of its prompt
SEED_PROMPT = (
    "The orchard at the end of the valley grows fruit that no market has ever sold: its keeper crosses "
    "old varieties every spring, writes their names in a green notebook, and tastes each one before "
    "the first frost. Some are sweet as honey, some are sour as lemons, and a few taste of nothing at all "
    "until they are cooked. This year the notebook holds a new page. Here is the name of the new fruit, and "
    "how it tastes:"
)


def test_a_seed_gives_the_same_text_with_and_without_a_cached_prefix(server: EngineServer) -> None:
    body = {"prompt": SEED_PROMPT, "max_tokens": 24, "temperature": 1.0, "seed": 7}
    other = SEED_PROMPT.replace("how it tastes", "how it looks")
    with httpx.Client(base_url=server.url, timeout=120) as http:
        runs = []
        for _ in range(2):  # cold (no other prompt began so), then with the whole prompt cached
            runs.append(http.post("/v1/completions", json=body).json())
        http.post("/v1/completions", json={"prompt": other, "max_tokens": 2})
        runs.append(http.post("/v1/completions", json=body).json())  # only the shared start cached
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in runs]
    assert runs[0]["usage"]["prompt_tokens"] > N_BATCH
    assert cached[0] <= 1  # at most the BOS token another prompt began with
    assert cached[1] == cached[2] == N_BATCH
    texts = [r["choices"][0]["text"] for r in runs]
    print(f"\nseed 7 at T=1 with {cached} cached tokens: {texts[0]!r}")
    assert texts[1] == texts[0]
    assert texts[2] == texts[0]
