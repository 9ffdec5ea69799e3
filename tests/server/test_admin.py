"""The GUI's admin routes, the public listener opened at run time, the Host allowlist, and a clean SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.server.hosts import LOOPBACK_NAMES, allowed_hosts, as_host, host_name, machine_names
from tests.support.server_helpers import EngineServer, engine_server

GEMMA_ARGS = ["--ngram", "--n-ctx", "1024", "--n-threads", "1"]  # robust on a busy 2-core machine
TOKEN = "admin-token-0123456789"
PUBLIC_KEY = "public-key-0123456789"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"


def error_code(response: httpx.Response) -> str:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "code", "param"}
    return body["error"]["code"]


def sse_payloads(lines: Iterator[str]) -> Iterator[Any]:
    """The data of each SSE event; '[DONE]' as the string."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


# --- the Host allowlist as a pure function ----------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8080", "localhost"),
        ("LocalHost", "localhost"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("[::1]:8080", "[::1]"),
        ("[::1]", "[::1]"),
        ("myhost.lan.:8080", "myhost.lan"),
        ("::1", ""),  # unbracketed IPv6 is not a Host
        ("", ""),
    ],
)
def test_host_name_drops_the_port(header: str, name: str) -> None:
    assert host_name(header) == name


LAN = ["MyBox", "mybox.example.lan.", "192.168.1.20", "fe80::1%eth0"]


def test_a_loopback_listener_answers_only_to_loopback_names() -> None:
    assert allowed_hosts("127.0.0.1", api_key=False) == LOOPBACK_NAMES
    assert allowed_hosts("127.0.0.1", api_key=True, lan_names=LAN) == LOOPBACK_NAMES
    assert allowed_hosts("::1", api_key=False) == LOOPBACK_NAMES
    assert allowed_hosts("127.0.0.2", api_key=False) == LOOPBACK_NAMES | {"127.0.0.2"}


def test_a_lan_listener_with_a_key_also_answers_to_the_machine_names() -> None:
    allowed = allowed_hosts("0.0.0.0", api_key=True, lan_names=LAN)
    assert allowed == LOOPBACK_NAMES | {"mybox", "mybox.example.lan", "192.168.1.20", "[fe80::1]"}
    assert "0.0.0.0" not in allowed
    assert allowed_hosts("192.168.1.20", api_key=True, lan_names=["mybox"]) == LOOPBACK_NAMES | {
        "192.168.1.20",
        "mybox",
    }
    assert "evil.example" not in allowed
    # Without a key (serve refuses such a bind anyway) the LAN names are not added.
    assert allowed_hosts("0.0.0.0", api_key=False, lan_names=LAN) == LOOPBACK_NAMES


def test_machine_names_hold_this_hostname_and_its_addresses() -> None:
    names = machine_names()
    assert as_host(socket.gethostname()) in names
    assert as_host(socket.getfqdn()) in names
    assert all(name == name.lower() for name in names)


# --- a GUI-like server: the admin token on stdin ----------------------------------------------------
@pytest.fixture(scope="module")
def gui(gemma_path: Path) -> Iterator[EngineServer]:
    args = ["--target", str(gemma_path), *GEMMA_ARGS, "--token-stdin"]
    with engine_server(args, stdin=TOKEN + "\n") as s:
        yield s


@pytest.fixture(scope="module")
def admin(gui: EngineServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gui.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as c:
        yield c


def test_admin_routes_need_the_token(gui: EngineServer, admin: httpx.Client) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        for method, path in (("GET", "/admin/public"), ("POST", "/admin/unload"), ("POST", "/admin/load")):
            response = httpx.request(method, f"{gui.url}{path}", headers=headers, json={"target": "x"})
            assert response.status_code == 401, (method, path, headers)
            assert error_code(response) == "unauthorized"
    assert admin.get("/admin/public").json() == {"open": False}
    # The token guards the GUI's listener as a whole; /health stays open for watchers.
    assert httpx.get(f"{gui.url}/v1/models").status_code == 401
    assert admin.get("/v1/models").status_code == 200
    assert httpx.get(f"{gui.url}/health").json() == {"status": "ok"}


def test_public_listener_opened_served_and_closed(gui: EngineServer, admin: httpx.Client) -> None:
    opened = admin.post("/admin/public", json={"host": "127.0.0.1", "port": 0, "api_key": PUBLIC_KEY})
    assert opened.status_code == 200, opened.text
    info = opened.json()
    port = info["port"]
    assert info["open"] is True
    assert info["auth"] is True
    assert port not in (0, gui.port)
    assert admin.get("/admin/public").json() == info
    public = f"http://127.0.0.1:{port}"

    editor = OpenAI(base_url=f"{public}/v1", api_key=PUBLIC_KEY, max_retries=0, timeout=60)
    out = editor.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6, temperature=0
    )
    assert out.choices[0].message.content
    stranger = OpenAI(base_url=f"{public}/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    assert error_code(httpx.get(f"{public}/v1/models")) == "unauthorized"
    assert httpx.get(f"{gui.url}/v1/models").status_code == 401  # each listener keeps its own key

    key = {"Authorization": f"Bearer {PUBLIC_KEY}"}
    for path in ("/admin/public", "/props"):  # the GUI's routes are absent on the public listener
        response = httpx.get(f"{public}{path}", headers=key)
        assert response.status_code == 404, path
        assert error_code(response) == "not_found"
    assert "foresight_requests_total" in httpx.get(f"{public}/metrics", headers=key).text
    assert httpx.get(f"{public}/health").status_code == 200
    bad_host = httpx.get(f"{public}/v1/models", headers={**key, "Host": "evil.example"})
    assert bad_host.status_code == 400
    assert error_code(bad_host) == "invalid_host"

    # Closing ends an in-flight stream cleanly: its last chunk says "cancelled", then [DONE].
    body = {"prompt": COUNTING, "max_tokens": 900, "temperature": 0, "stream": True}
    closed: list[httpx.Response] = []
    with httpx.stream("POST", f"{public}/v1/completions", json=body, headers=key, timeout=60) as stream:
        lines = stream.iter_lines()
        first = next(sse_payloads(lines))
        assert first["choices"][0]["finish_reason"] is None
        closer = threading.Thread(target=lambda: closed.append(admin.delete("/admin/public")))
        closer.start()
        rest = list(sse_payloads(lines))
    closer.join(30)
    assert rest[-1] == "[DONE]"
    assert rest[-2]["choices"][0]["finish_reason"] == "cancelled"
    assert closed[0].json() == {"open": False}
    assert admin.get("/admin/public").json() == {"open": False}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{public}/health", timeout=5)
    assert admin.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 2}).status_code == 200


def test_a_lan_listener_needs_a_key_and_answers_to_this_machine(
    gui: EngineServer, admin: httpx.Client
) -> None:
    refused = admin.post("/admin/public", json={"host": "0.0.0.0", "port": 0})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "api_key"
    assert admin.post("/admin/public", json={"port": 70000}).status_code == 400
    taken = admin.post("/admin/public", json={"port": gui.port})
    assert taken.status_code == 409
    assert error_code(taken) == "listen_failed"
    assert admin.get("/admin/public").json() == {"open": False}

    opened = admin.post("/admin/public", json={"host": "0.0.0.0", "port": 0, "api_key": PUBLIC_KEY})
    assert opened.status_code == 200, opened.text
    url = f"http://127.0.0.1:{opened.json()['port']}/v1/models"
    key = {"Authorization": f"Bearer {PUBLIC_KEY}"}
    try:
        assert httpx.get(url, headers={**key, "Host": socket.gethostname()}).status_code == 200
        assert httpx.get(url, headers={**key, "Host": "localhost"}).status_code == 200
        rebound = httpx.get(url, headers={**key, "Host": "attacker.example:80"})
        assert rebound.status_code == 400
        assert error_code(rebound) == "invalid_host"
    finally:
        assert admin.delete("/admin/public").json() == {"open": False}


def test_load_a_pair_with_progress_then_serve_with_it(admin: httpx.Client, gemma_path: Path) -> None:
    body = {"target": str(gemma_path), "draft": str(gemma_path)}
    with admin.stream("POST", "/admin/load", json=body) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = sse_payloads(stream.iter_lines())
        seen = [next(events), next(events), next(events)]
        assert [e["stage"] for e in seen] == ["unloading", "finding devices", "loading target"]
        # Meanwhile: generation answers 503 model_not_loaded, and a second load is refused.
        during = admin.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 2})
        assert during.status_code == 503
        assert error_code(during) == "model_not_loaded"
        assert error_code(admin.post("/admin/load", json=body)) == "model_busy"
        seen += list(events)
    assert [e if e == "[DONE]" else e["stage"] for e in seen] == [
        "unloading",
        "finding devices",  # the device is left to the placement (auto)
        "loading target",
        "loading drafter",
        "calibrating",
        "ready",
        "[DONE]",
    ]
    assert seen[-2]["draft"] == "model"
    out = admin.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 4, "temperature": 0})
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["speculative"]["draft_source"] == "model"
    assert admin.get("/props").json()["draft"]["source"] == "model"


def test_unload_then_model_not_loaded_then_load_again(
    gui: EngineServer, admin: httpx.Client, gemma_path: Path
) -> None:
    assert admin.post("/admin/unload").json() == {"status": "unloaded"}
    for response in (
        admin.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}),
        admin.get("/v1/models"),
    ):
        assert response.status_code == 503
        assert error_code(response) == "model_not_loaded"
    health = httpx.get(f"{gui.url}/health")
    assert (health.status_code, health.json()) == (503, {"status": "unloaded"})

    with admin.stream("POST", "/admin/load", json={"target": str(gemma_path), "ngram": True}) as stream:
        events = list(sse_payloads(stream.iter_lines()))
    assert [e if e == "[DONE]" else e["stage"] for e in events] == [
        "finding devices",
        "loading target",
        "calibrating",
        "ready",
        "[DONE]",
    ]
    out = admin.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 4, "temperature": 0})
    assert out.json()["usage"]["speculative"]["draft_source"] == "ngram"
    assert httpx.get(f"{gui.url}/health").json() == {"status": "ok"}


def test_a_failed_load_reports_its_error_and_a_good_load_recovers(
    gui: EngineServer, admin: httpx.Client, gemma_path: Path, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.gguf"
    notes.write_text("these are my notes, not a model")
    with admin.stream("POST", "/admin/load", json={"target": str(notes)}) as stream:
        events = list(sse_payloads(stream.iter_lines()))
    assert [e["stage"] for e in events[:-2]] == ["unloading", "finding devices", "loading target"]
    assert events[-2]["error"]["code"] == "model_load_failed"
    assert "not a GGUF file" in events[-2]["error"]["message"]
    assert events[-1] == "[DONE]"
    health = httpx.get(f"{gui.url}/health")
    assert (health.status_code, health.json()["status"]) == (503, "failed")
    assert error_code(admin.post("/v1/completions", json={"prompt": COUNTING})) == "model_not_loaded"

    with admin.stream("POST", "/admin/load", json={"target": str(gemma_path), "ngram": True}) as stream:
        assert list(sse_payloads(stream.iter_lines()))[-2]["stage"] == "ready"
    assert admin.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"target": "/nowhere/missing.gguf"}, "target"),
        ({"target": "~nosuchuser-foresight/x.gguf"}, "target"),
        ({"target": "GEMMA", "draft": "/nowhere/missing.gguf"}, "draft"),
        ({"target": "GEMMA", "draft": "GEMMA", "ngram": True}, "ngram"),
        ({"target": "GEMMA", "n_ctx": 512}, "n_ctx"),
        ({}, "target"),
    ],
    ids=[
        "missing-target",
        "unknown-user-home",
        "missing-draft",
        "draft-and-ngram",
        "unknown-field",
        "no-target",
    ],
)
def test_a_bad_load_changes_nothing(
    admin: httpx.Client, gemma_path: Path, body: dict[str, Any], param: str
) -> None:
    body = {k: str(gemma_path) if v == "GEMMA" else v for k, v in body.items()}
    before = admin.get("/props").json()["draft"]["source"]
    response = admin.post("/admin/load", json=body)
    assert response.status_code == 400, response.text
    assert error_code(response) == "invalid_request_error"
    assert response.json()["error"]["param"] == param
    assert admin.get("/props").json()["draft"]["source"] == before
    assert admin.post("/v1/completions", json={"prompt": COUNTING, "max_tokens": 1}).status_code == 200


# --- without a token; SIGTERM -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def bare(gemma_path: Path) -> Iterator[EngineServer]:
    with engine_server(["--target", str(gemma_path), *GEMMA_ARGS]) as s:
        yield s


def test_admin_routes_are_off_without_a_token(bare: EngineServer) -> None:
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        response = httpx.post(f"{bare.url}/admin/public", json={"port": 0}, headers=headers)
        assert response.status_code == 404
        assert "FORESIGHT_ADMIN_TOKEN" in response.json()["error"]["message"]
    assert httpx.get(f"{bare.url}/v1/models").status_code == 200  # no token: loopback stays open


def test_sigterm_ends_a_running_stream_and_exits_0(bare: EngineServer) -> None:
    body = {"prompt": COUNTING, "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{bare.url}/v1/completions", json=body, timeout=30) as stream:
        lines = stream.iter_lines()
        assert next(sse_payloads(lines))["choices"][0]["finish_reason"] is None
        t0 = time.monotonic()
        bare.proc.send_signal(signal.SIGTERM)
        rest = list(sse_payloads(lines))
    assert bare.wait_exit(10) == 0, bare.log_tail()
    assert time.monotonic() - t0 < 5
    assert rest[-1] == "[DONE]"
    assert rest[-2]["choices"][0]["finish_reason"] == "cancelled"
