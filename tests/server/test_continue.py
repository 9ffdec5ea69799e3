"""continue_final_message on the private listener: an answer cut short is carried on from its last word,
and a request that cannot be continued is refused by name (a real serve of gemma-3-270m)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.engine.chat import CONTINUE_PARAM, continued
from app.engine.errors import InvalidRequest
from tests.support.server_helpers import EngineServer, engine_server

GEMMA_ARGS = ["--no-draft", "--n-ctx", "1024", "--n-threads", "1"]
TOKEN = "continue-token-0123456789"
QUESTION = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def gui(gemma_path: Path) -> Iterator[EngineServer]:
    with engine_server(["--target", str(gemma_path), *GEMMA_ARGS, "--token-stdin"], stdin=TOKEN + "\n") as s:
        yield s


@pytest.fixture(scope="module")
def client(gui: EngineServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gui.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as c:
        yield c


def _chat(client: httpx.Client, messages: list[dict], max_tokens: int, **extra) -> httpx.Response:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "logprobs": True, **extra}
    return client.post("/v1/chat/completions", json=body)


def test_continued_splits_off_the_final_answer_and_refuses_any_other_last_turn() -> None:
    before, text = continued([*QUESTION, {"role": "assistant", "content": "Once upon"}])
    assert before == QUESTION
    assert text == "Once upon"
    with pytest.raises(InvalidRequest, match=CONTINUE_PARAM) as refused:
        continued(QUESTION)
    assert refused.value.param == CONTINUE_PARAM  # type: ignore[attr-defined]


def test_an_answer_cut_short_is_continued_where_it_stopped(client: httpx.Client) -> None:
    whole = _chat(client, QUESTION, 24)
    assert whole.status_code == 200, whole.text
    tokens = [t["token"] for t in whole.json()["choices"][0]["logprobs"]["content"]]
    answer = whole.json()["choices"][0]["message"]["content"]
    assert len(tokens) == 24
    cut = "".join(tokens[:10])  # cut at a token boundary, as a stopped stream leaves it
    assert answer.startswith(cut)
    rest = _chat(client, [*QUESTION, {"role": "assistant", "content": cut}], 14, continue_final_message=True)
    assert rest.status_code == 200, rest.text
    # greedy: the continuation is what the whole answer said after the cut
    assert cut + rest.json()["choices"][0]["message"]["content"] == answer


def test_continuing_needs_the_assistant_last(client: httpx.Client) -> None:
    refused = _chat(client, QUESTION, 4, continue_final_message=True)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == CONTINUE_PARAM
    assert CONTINUE_PARAM in error["message"]


def test_the_public_listener_refuses_it_by_name(client: httpx.Client) -> None:
    public = client.post("/admin/public", json={"host": "127.0.0.1", "port": 0}).json()
    try:
        body = {
            "messages": [*QUESTION, {"role": "assistant", "content": "Once"}],
            "max_tokens": 2,
            CONTINUE_PARAM: True,
        }
        refused = httpx.post(f"{public['url']}/chat/completions", json=body, timeout=60)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == CONTINUE_PARAM
        assert refused.json()["error"]["code"] == "unsupported_field"
    finally:
        client.delete("/admin/public")
