"""Fair admission: the wait's bound (503), each client's cap (429), Retry-After from the queue, FIFO order.

The Admission is exercised on its own with real tickets and results, then through real servers: 16
clients (each its own loopback address) x 3 streams, and one client over its cap while another is served.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.server.admission import Admission
from app.server.errors import APIError
from app.server.runner.base import END, Started
from tests.support.server_helpers import EngineServer, engine_server

CLIENTS, REQUESTS = 16, 3
TOKEN, API_KEY = "window-token-0123456789", "api-key-0123456789"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"
WAIT_S = 60.0  # conditions the engine brings about are waited for this long at most


# --- the Admission on its own -----------------------------------------------------------------------
def test_the_wait_is_bounded_and_cancelled_waiters_hold_no_place() -> None:
    admission = Admission(queue_size=2, per_client=8)
    running = admission.admit("a", threading.Event())
    running.put(Started())
    waiting = [admission.admit(c, threading.Event()) for c in ("b", "c")]
    with pytest.raises(APIError) as refused:
        admission.admit("d", threading.Event())
    assert (refused.value.status, refused.value.code) == (503, "server_busy")
    assert int(refused.value.headers["Retry-After"]) >= 1
    waiting[0].ticket.cancel.set()  # its client left: the worker will drop it
    admission.admit("d", threading.Event())
    assert admission.counters.admitted == 4
    assert admission.counters.rejected_busy == 1


def test_a_client_at_its_cap_gets_429_and_others_are_admitted() -> None:
    admission = Admission(queue_size=64, per_client=2)
    own = [admission.admit("a", threading.Event()) for _ in range(2)]
    with pytest.raises(APIError) as refused:
        admission.admit("a", threading.Event())
    assert (refused.value.status, refused.value.code) == (429, "too_many_requests")
    assert int(refused.value.headers["Retry-After"]) >= 1
    admission.admit("b", threading.Event())
    own[0].put(Started())
    own[0].put(END)  # one of its own ended: the client may send again
    admission.admit("a", threading.Event())
    assert admission.counters.rejected_client == 1


def test_jobs_start_and_end_through_their_results() -> None:
    admission = Admission(queue_size=8, per_client=8)
    first, second = admission.admit("a", threading.Event()), admission.admit("b", threading.Event())
    assert admission.waiting() == 2
    first.put(Started())
    second.put(RuntimeError("refused at render"))  # an error as the first result ends the job
    assert (first.ticket.start_number, second.ticket.start_number) == (1, 2)
    assert admission.waiting() == 0
    assert first.ticket.headers()["X-Foresight-Ticket"] == "1"
    assert first.ticket.headers()["X-Foresight-Start"] == "1"
    first.put(END)
    assert "foresight_admitted_total 2" in admission.prometheus()


# --- through real servers ---------------------------------------------------------------------------
def loopback_addresses(n: int, first: int = 10) -> list[str]:
    """n distinct loopback source addresses (127.0.0.x): each is a client of its own to the server."""
    addresses = [f"127.0.0.{first + i}" for i in range(n)]
    with socket.socket() as probe:
        try:
            probe.bind((addresses[-1], 0))
        except OSError:
            pytest.skip(
                "this OS gives loopback only 127.0.0.1: the clients cannot have addresses of their own"
            )
    return addresses


def metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
    rows = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in rows}


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.05)


@dataclass
class Answer:
    client: int
    status: int
    ticket: int
    start: int
    waited_s: float
    first_token_s: float
    total_s: float
    text: str


def stream_chat(http: httpx.Client, client: int, n: int) -> Answer:
    body = {
        "messages": [{"role": "user", "content": f"Client {client}, question {n}: name a fruit."}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
    }
    t0 = time.perf_counter()
    first, text = None, []
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read().decode()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            assert "error" not in event, event
            content = "".join(c["delta"].get("content") or "" for c in event["choices"])
            if content and first is None:
                first = time.perf_counter() - t0
            text.append(content)
        headers = response.headers
    total = time.perf_counter() - t0
    return Answer(
        client,
        response.status_code,
        int(headers["X-Foresight-Ticket"]),
        int(headers["X-Foresight-Start"]),
        float(headers["X-Foresight-Waited"]),
        total if first is None else first,
        total,
        "".join(text),
    )


@pytest.fixture(scope="module")
def open_server(gemma_path: Path) -> Iterator[EngineServer]:
    """No key: each remote address is a client. Default wait bound and per-client cap."""
    # One thread: on a busy 2-core machine two llama.cpp threads wait on each other at every step.
    args = ["--target", str(gemma_path), "--ngram", "--n-ctx", "1024", "--n-threads", "1"]
    with engine_server(args) as s:
        yield s


def test_16_clients_x_3_streams_all_served_in_admission_order(open_server: EngineServer) -> None:
    addresses = loopback_addresses(CLIENTS)
    before = metrics(open_server.url)

    def run_client(client: int) -> list[Answer]:
        transport = httpx.HTTPTransport(local_address=addresses[client])
        with httpx.Client(base_url=open_server.url, transport=transport, timeout=300) as http:
            return [stream_chat(http, client, n) for n in range(REQUESTS)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = [a for batch in pool.map(run_client, range(CLIENTS)) for a in batch]

    assert len(answers) == CLIENTS * REQUESTS
    assert all(a.status == 200 and a.text for a in answers)
    assert sorted(sum(1 for a in answers if a.client == c) for c in range(CLIENTS)) == [REQUESTS] * CLIENTS
    # FIFO: in the order they were admitted, whoever sent them, the jobs left the wait
    starts = [a.start for a in sorted(answers, key=lambda a: a.ticket)]
    assert starts == sorted(starts)
    after = metrics(open_server.url)
    assert after["foresight_admitted_total"] - before["foresight_admitted_total"] == CLIENTS * REQUESTS
    assert after["foresight_rejected_busy_total"] == before["foresight_rejected_busy_total"]
    assert after["foresight_rejected_client_cap_total"] == before["foresight_rejected_client_cap_total"]
    assert after["foresight_requests_failed_total"] == before["foresight_requests_failed_total"]
    assert after["foresight_waiting"] == 0

    latencies = sorted(a.total_s for a in answers)
    first_tokens = sorted(a.first_token_s for a in answers)
    p95 = latencies[max(0, round(0.95 * len(latencies)) - 1)]
    print(
        f"\nadmission load: {len(answers)} streams from {CLIENTS} clients; latency p50 "
        f"{statistics.median(latencies):.2f} s, p95 {p95:.2f} s; first token p50 "
        f"{statistics.median(first_tokens):.2f} s; longest wait {max(a.waited_s for a in answers):.2f} s "
        f"(server: {after['foresight_wait_seconds_max']:.2f} s)"
    )


@pytest.fixture(scope="module")
def capped_server(gemma_path: Path) -> Iterator[EngineServer]:
    """The window's token and an API key, two requests at most per client."""
    args = [
        "--target",
        str(gemma_path),
        "--ngram",
        "--n-ctx",
        "4096",
        "--n-threads",
        "1",
        "--per-client",
        "2",
    ]
    with engine_server(args, env={"FORESIGHT_ADMIN_TOKEN": TOKEN, "FORESIGHT_API_KEY": API_KEY}) as s:
        yield s


def open_stream(server: EngineServer, key: str) -> socket.socket:
    """A long streamed completion on a raw socket: closing the socket is the client leaving."""
    body = json.dumps({"prompt": COUNTING, "max_tokens": 3000, "temperature": 0, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    sock.sendall(head.encode() + body)
    return sock


def test_a_client_over_its_cap_gets_429_while_another_is_served(capped_server: EngineServer) -> None:
    url, window, keyed = (
        capped_server.url,
        {"Authorization": f"Bearer {TOKEN}"},
        {"Authorization": f"Bearer {API_KEY}"},
    )
    base = metrics(url, window)["foresight_admitted_total"]
    small = {"prompt": COUNTING, "max_tokens": 2, "temperature": 0}
    other: list[httpx.Response] = []
    served = threading.Thread(
        target=lambda: other.append(
            httpx.post(f"{url}/v1/completions", json=small, headers=keyed, timeout=300)
        )
    )
    streams = []
    try:
        for n in (1, 2):  # the window's two long streams: running or waiting, they are its cap
            streams.append(open_stream(capped_server, TOKEN))
            wait_for(
                lambda n=n: metrics(url, window)["foresight_admitted_total"] == base + n,
                f"stream {n} admitted",
            )
        over = httpx.post(f"{url}/v1/completions", json=small, headers=window, timeout=WAIT_S)
        assert over.status_code == 429, over.text
        assert over.json()["error"]["code"] == "too_many_requests"
        assert int(over.headers["Retry-After"]) >= 1
        served.start()  # another client (the API key's) is admitted while the window is at its cap
        wait_for(
            lambda: metrics(url, window)["foresight_admitted_total"] == base + 3, "the key's request admitted"
        )
    finally:
        for sock in streams:  # the window leaves: its running stream is cancelled, a waiting one dropped
            sock.close()
    served.join(300)
    assert other, "the key's request got no answer"
    assert other[0].status_code == 200, other[0].text
    assert other[0].json()["choices"][0]["text"]
    after = metrics(url, window)
    assert after["foresight_rejected_client_cap_total"] == 1
    assert after["foresight_rejected_busy_total"] == 0

    def window_served_again() -> bool:  # once the server has seen it leave, its cap is free
        return httpx.post(f"{url}/v1/completions", json=small, headers=window, timeout=300).status_code == 200

    wait_for(window_served_again, "the window served again after its streams closed")
