"""What web pages and other machines meet: non-JSON bodies, foreign Origins, key headers, /props paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.api import CHAT, COMPLETIONS, MESSAGES
from tests.support.server_helpers import EngineServer, engine_server

KEY = "guard-test-key-0123456789"
ALLOWED = "http://editor.example"
BODY = b'{"prompt": "1, 2, 3,", "max_tokens": 1, "temperature": 0}'


@pytest.fixture(scope="module")
def lan(gemma_path: Path) -> Iterator[EngineServer]:
    """A listener other machines can reach: on all addresses, behind a key, with one allowed web origin."""
    args = [
        "--target",
        str(gemma_path),
        "--no-draft",
        "--n-ctx",
        "1024",
        "--n-threads",
        "2",
        "--host",
        "0.0.0.0",
    ]
    env = {"FORESIGHT_API_KEY": KEY, "FORESIGHT_SERVER__CORS_ORIGIN": ALLOWED}
    with engine_server(args, env=env) as s:
        yield s


def _requests_run(server: EngineServer) -> float:
    rows = httpx.get(f"{server.url}/metrics", headers={"x-api-key": KEY}).text.splitlines()
    return next(float(r.split()[1]) for r in rows if r.startswith("foresight_requests_total "))


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        None,
    ],
)
def test_a_body_that_is_not_json_gets_415_and_runs_nothing(
    lan: EngineServer, content_type: str | None
) -> None:
    before = _requests_run(lan)
    headers = {"Authorization": f"Bearer {KEY}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    for path in (COMPLETIONS, CHAT, MESSAGES, "/admin/load"):
        response = httpx.post(f"{lan.url}{path}", content=BODY, headers=headers)
        assert response.status_code == 415, (path, response.text)
    assert response.json()["error"]["code"] == "unsupported_media_type"
    anthropic = httpx.post(f"{lan.url}{MESSAGES}", content=BODY, headers=headers).json()
    assert anthropic["type"] == "error"
    assert _requests_run(lan) == before
    json_headers = {**headers, "Content-Type": "application/json; charset=utf-8"}
    assert httpx.post(f"{lan.url}{COMPLETIONS}", content=BODY, headers=json_headers).status_code == 200


def test_a_foreign_origin_gets_403_and_runs_nothing(lan: EngineServer) -> None:
    before = _requests_run(lan)
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{lan.port}"):
        response = httpx.post(f"{lan.url}{COMPLETIONS}", content=BODY, headers={**auth, "Origin": origin})
        assert response.status_code == 403, origin
        assert response.json()["error"]["code"] == "forbidden_origin"
    assert _requests_run(lan) == before
    allowed = httpx.post(f"{lan.url}{COMPLETIONS}", content=BODY, headers={**auth, "Origin": ALLOWED})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ALLOWED
    preflight = httpx.options(
        f"{lan.url}{COMPLETIONS}",
        headers={
            "Origin": ALLOWED,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-api-key",
        },
    )
    assert preflight.status_code == 200


def test_either_key_header_opens_every_route(lan: EngineServer) -> None:
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        assert httpx.get(f"{lan.url}/v1/models", headers=headers).status_code == 200
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.get(f"{lan.url}/v1/models", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
    body = {"model": "any", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(f"{lan.url}{MESSAGES}", json=body)
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"  # Anthropic's shape on its route
    assert (
        httpx.post(f"{lan.url}{MESSAGES}?beta=true", json=body, headers={"x-api-key": KEY}).status_code == 200
    )


def test_the_root_answers_without_a_key(lan: EngineServer) -> None:
    assert httpx.head(f"{lan.url}/").status_code == 200
    root = httpx.get(f"{lan.url}/")
    assert root.status_code == 200
    assert root.json()["status"] == "ready"


def test_props_on_a_lan_listener_shows_file_names_not_paths(lan: EngineServer, gemma_path: Path) -> None:
    props = httpx.get(f"{lan.url}/props", headers={"x-api-key": KEY}).json()
    assert props["target"]["path"] == gemma_path.name
    assert str(gemma_path.parent) not in httpx.get(f"{lan.url}/props", headers={"x-api-key": KEY}).text
