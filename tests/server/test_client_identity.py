"""Who a client is, through the real server: the window (its token) and an API key on the public listener are
two clients: their KV prefixes stay apart (cached_tokens), and both admit through the one shared wait."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server_helpers import engine_server

TOKEN, PUBLIC_KEY = "window-token-0123456789", "public-key-0123456789"
SHARED = (
    "Here are the rules of the kitchen: wash your hands, label every jar with the date, keep raw meat on "
    "the lowest shelf, taste with a clean spoon, and write down anything you run out of. "
)


@pytest.fixture(scope="module")
def window_and_public(gemma_path: Path) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    args = ["--target", str(gemma_path), "--n-ctx", "2048", "--n-threads", "2"]
    with (
        engine_server(args, env={"FORESIGHT_ADMIN_TOKEN": TOKEN}) as server,
        httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
        ) as window,
    ):
        opened = window.post("/admin/public", json={"host": "127.0.0.1", "port": 0, "api_key": PUBLIC_KEY})
        assert opened.status_code == 200, opened.text
        public_url = f"http://127.0.0.1:{opened.json()['port']}"
        with httpx.Client(
            base_url=public_url, headers={"Authorization": f"Bearer {PUBLIC_KEY}"}, timeout=120
        ) as public:
            yield window, public


def ask(http: httpx.Client, question: str) -> tuple[int, int]:
    """(cached prompt tokens, admission ticket) of one short chat answer to the shared text + question."""
    body = {"messages": [{"role": "user", "content": SHARED + question}], "max_tokens": 4, "temperature": 0}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached, int(response.headers["X-Foresight-Ticket"])


def test_the_window_and_a_key_share_no_prefix_but_keep_their_own(
    window_and_public: tuple[httpx.Client, httpx.Client],
) -> None:
    window, public = window_and_public
    _, first = ask(window, "What goes on the lowest shelf?")
    across, second = ask(public, "What do you do with a jar?")
    assert across == 0  # the window's prefix is not the key's to reuse
    own_window, third = ask(window, "What do you taste with?")
    own_key, fourth = ask(public, "What do you write down?")
    assert own_window > 0
    assert own_key > 0
    assert first < second < third < fourth  # one wait, whichever listener a request came in by
    print(
        f"\ncached tokens: across clients {across}; within the window {own_window}, within the key {own_key}"
    )
