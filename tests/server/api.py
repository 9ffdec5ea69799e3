"""Helpers of the API tests: posting JSON to a test server, and checking that it still serves."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.server_helpers import EngineServer

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"


def post(server: EngineServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=300, **kwargs)


def still_serves(server: EngineServer) -> bool:
    body = {"prompt": "1, 2, 3,", "max_tokens": 1, "temperature": 0}
    return post(server, COMPLETIONS, body).status_code == 200


def sse_events(response: httpx.Response) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of each server-sent event ([DONE] as the string)."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
            events.append((name, data if data == "[DONE]" else json.loads(data)))
            name = None
    return events
