"""The client's one reader of server-sent events, over real HTTP on loopback: events split across reads,
payloads that are not JSON, errors in the stream and before it, an abort; for chats and model loads."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pytestqt.qtbot import QtBot

from app.services.client import EngineClient, EventStream
from app.services.library.loading import load_pair

WAIT_MS = 10_000
CHUNKS = [
    {"choices": [{"delta": {"content": "Hel"}}], "speculative_tokens": [False]},
    {"choices": [{"delta": {"content": "lo!"}}], "speculative_tokens": [True, True]},
    {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"total_tokens": 9}},
]


def _sse(payload: object) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


class Engine(BaseHTTPRequestHandler):
    """Answers as the engine's routes do: streams of events, or a refusal with an OpenAI error body."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes, as a stream does
    release = threading.Event()

    def log_message(self, *_args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers["Authorization"] != "Bearer secret":
            return self._refuse(401, "unauthorized")
        if self.path == "/admin/load":
            return self._refuse(400, "no such model file: gone.gguf")
        asked = (body.get("messages") or [{}])[-1].get("content")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if asked == "stall":
            self._write(_sse(CHUNKS[0]))
            self.release.wait(30)
            return
        if asked == "fail":
            self._write(_sse(CHUNKS[0]) + _sse({"error": {"message": "the engine is busy"}}))
            return
        whole = b"".join(_sse(c) for c in CHUNKS[:2]) + _sse("not json") + _sse(CHUNKS[2]) + _sse("[DONE]")
        for start in range(0, len(whole), 7):  # split anywhere, inside events too
            self._write(whole[start : start + 7])

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _refuse(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self._write(body)


@pytest.fixture
def client(qtbot: QtBot) -> Iterator[EngineClient]:
    Engine.release.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    engine = EngineClient()
    engine.configure(f"http://127.0.0.1:{server.server_address[1]}", "secret")
    yield engine
    Engine.release.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_events_split_across_reads_arrive_whole_and_in_order(qtbot: QtBot, client: EngineClient) -> None:
    events = client.post_events("/v1/chat/completions", json.dumps({"messages": []}).encode())
    seen: list[dict] = []
    events.event.connect(seen.append)
    with qtbot.waitSignal(events.ended, timeout=WAIT_MS) as ended:
        pass
    assert ended.args == [""]
    assert seen == CHUNKS  # "not json" and [DONE] are no events


def test_a_chat_stream_gives_pieces_with_their_flags_then_the_finish(
    qtbot: QtBot, client: EngineClient
) -> None:
    stream = client.stream_chat([{"role": "user", "content": "hi"}], temperature=0.0, seed=None)
    assert json.loads(stream.body) == {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,  # None is left out: the engine's default holds
    }
    pieces: list[tuple[str, list]] = []
    stream.piece.connect(lambda text, flags: pieces.append((text, flags)))
    with qtbot.waitSignal(stream.finished, timeout=WAIT_MS) as finished:
        pass
    assert pieces == [("Hel", [False]), ("lo!", [True, True])]
    assert finished.args == ["length", {"total_tokens": 9}]


def test_an_error_in_the_stream_or_before_it_fails_with_the_engine_s_words(
    qtbot: QtBot, client: EngineClient
) -> None:
    stream = client.stream_chat([{"role": "user", "content": "fail"}])
    with qtbot.waitSignal(stream.failed, timeout=WAIT_MS) as failed:
        pass
    assert failed.args == ["the engine is busy"]

    load = load_pair(client, "gone.gguf", ngram=True)
    with qtbot.waitSignal(load.failed, timeout=WAIT_MS) as load_failed:
        pass
    assert load_failed.args == ["no such model file: gone.gguf (HTTP 400)"]

    client.configure(client.base_url, "wrong")
    refused = client.post_events("/v1/chat/completions", b"{}")
    with qtbot.waitSignal(refused.ended, timeout=WAIT_MS) as ended:
        pass
    assert ended.args == ["unauthorized (HTTP 401)"]
    assert not refused.aborted


def test_an_aborted_stream_ends_without_a_failure(qtbot: QtBot, client: EngineClient) -> None:
    stream = client.stream_chat([{"role": "user", "content": "stall"}])
    pieces: list[str] = []
    stream.delta.connect(pieces.append)
    qtbot.waitUntil(lambda: pieces == ["Hel"], timeout=WAIT_MS)
    with (
        qtbot.assertNotEmitted(stream.failed),
        qtbot.waitSignal(stream.finished, timeout=WAIT_MS) as finished,
    ):
        stream.abort()
    assert finished.args == ["aborted", {}]
    events = stream.findChild(EventStream)
    assert events is not None
    assert events.aborted
