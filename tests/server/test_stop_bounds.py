"""Stop strings are bounded (fields.MAX_STOP of at most MAX_STOP_CHARS characters) on every route."""

from __future__ import annotations

import pytest

from app.server.fields import MAX_STOP, MAX_STOP_CHARS
from tests.server.api import CHAT, COMPLETIONS, MESSAGES, post
from tests.support.server_helpers import EngineServer

ASK = {"messages": [{"role": "user", "content": "Count: 1, 2, 3,"}], "max_tokens": 2, "temperature": 0}
LIMITS = f"at most {MAX_STOP} stop strings of at most {MAX_STOP_CHARS} characters each"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {**ASK, "stop": ["x"] * (MAX_STOP + 1)}, "stop"),
        (CHAT, {**ASK, "stop": "y" * (MAX_STOP_CHARS + 1)}, "stop"),
        (
            COMPLETIONS,
            {"prompt": "1, 2,", "max_tokens": 2, "stop": ["a", "z" * (MAX_STOP_CHARS + 1)]},
            "stop[1]",
        ),
        (MESSAGES, {**ASK, "stop_sequences": ["w" * (MAX_STOP_CHARS + 1)]}, "stop_sequences[0]"),
    ],
    ids=["chat-count", "chat-one-string", "completions-length", "messages-length"],
)
def test_over_the_bounds_is_a_400_naming_stop(
    gemma_api: EngineServer, path: str, body: dict, param: str
) -> None:
    response = post(gemma_api, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert LIMITS in error["message"]


def test_at_the_bounds_the_request_is_served(gemma_api: EngineServer) -> None:
    stops = [f"{i:02d}" + "q" * (MAX_STOP_CHARS - 2) for i in range(MAX_STOP)]
    response = post(gemma_api, CHAT, {**ASK, "stop": stops})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
