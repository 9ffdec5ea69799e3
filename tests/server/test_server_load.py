"""Load: concurrent clients against the real server, with no errors and no KV left behind."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server_helpers import EngineServer, engine_server

TOKEN = "gui-token-0123456789"
CLIENTS, REQUESTS = 8, 5
FINAL = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[EngineServer]:
    # One thread: on a busy 2-core machine two llama.cpp threads wait on each other at every step.
    args = ["--target", str(gemma_path), "--ngram", "--n-ctx", "1024", "--n-threads", "1"]
    with engine_server([*args, "--queue-size", str(CLIENTS)], env={"FORESIGHT_ADMIN_TOKEN": TOKEN}) as s:
        yield s


def gauges(http: httpx.Client) -> dict[str, float]:
    rows = (line.split() for line in http.get("/metrics").text.splitlines() if line and line[0] != "#")
    return {name: float(value) for name, value in rows}


def one_request(http: httpx.Client, client: int, n: int) -> tuple[float, dict[str, Any]]:
    """Chat and text completions, streamed and not, with prompts that differ per client and request."""
    t0 = time.perf_counter()
    if n % 2 == 0:
        content = f"Client {client} asks question {n}: name a fruit."
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}
        response = http.post("/v1/chat/completions", json=body)
    else:
        body = {"prompt": f"{client} + {n} =", "max_tokens": 8, "temperature": 0.7, "seed": client}
        if n == 3:
            body.update(stream=True, stream_options={"include_usage": True})
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    if body.get("stream"):
        assert response.text.rstrip().endswith("data: [DONE]")
        return time.perf_counter() - t0, {"streamed": True}
    return time.perf_counter() - t0, response.json()


def test_8_clients_x_5_requests_without_errors_or_leaked_kv(server: EngineServer) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=300) as http:
        reference = http.post("/v1/completions", json=FINAL).json()["choices"][0]["text"]

        def run_client(client: int) -> list[tuple[float, dict[str, Any]]]:
            with httpx.Client(base_url=server.url, headers=auth, timeout=300) as own:
                return [one_request(own, client, n) for n in range(REQUESTS)]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = [r for batch in pool.map(run_client, range(CLIENTS)) for r in batch]
        wall = time.perf_counter() - t0

        assert len(results) == CLIENTS * REQUESTS
        for _, body in results:
            assert body.get("streamed") or body["usage"]["completion_tokens"] >= 1
        latencies = sorted(seconds for seconds, _ in results)
        p95 = latencies[max(0, round(0.95 * len(latencies)) - 1)]
        print(
            f"\nload: {len(results)} requests from {CLIENTS} clients in {wall:.2f} s = "
            f"{len(results) / wall:.2f} requests/s; latency p50 {statistics.median(latencies):.3f} s, "
            f"p95 {p95:.3f} s"
        )
        after = gauges(http)
        assert after["foresight_requests_failed_total"] == 0
        assert after["foresight_queue_depth"] == 0

        # Nothing left behind: the cache holds exactly the last request's tokens (the final pending
        # token never enters it), llama.cpp's cells agree, and the answer equals the one before the load.
        final = http.post("/v1/completions", json=FINAL).json()
        assert final["choices"][0]["text"] == reference
        kv = gauges(http)
        usage = final["usage"]
        assert kv["foresight_kv_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1
        assert kv["foresight_kv_cells"] == kv["foresight_kv_tokens"]
