"""HTTP/SSE client for the engine's OpenAI-compatible API, on Qt's event loop (no threads).

`EventStream` is the one reader of server-sent events (a chat completion's, a model load's).
`ChatStream` posts one streamed chat completion and turns its events into signals: text
deltas as they arrive (`piece` adds the engine's per-token accepted-draft flags), then `finished` with
the finish reason and usage (speculation stats included), or `failed` with the server's error message.
`abort()` closes the connection, which cancels the generation on the engine within one step.
"""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest


def reply_error(reply: QNetworkReply, body: bytes) -> str:
    """A failed reply in words: the engine's error message from an OpenAI-shaped JSON body (else Qt's
    description of the failure), with the HTTP status where there was one."""
    status = reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute)
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = reply.errorString()
    return f"{message} (HTTP {status})" if status else message


def event_error(event: dict[str, Any]) -> str | None:
    """The message of an `{"error": ...}` event (an object with a message, or words), else None."""
    if "error" not in event:
        return None
    error = event["error"]
    return str(error.get("message", error) if isinstance(error, dict) else error)


def sse_data(buffer: bytes) -> tuple[list[str], bytes]:
    """The `data:` payloads of the complete server-sent events in `buffer`, and what is left of it."""
    payloads = []
    while b"\n\n" in buffer:
        event, buffer = buffer.split(b"\n\n", 1)
        for line in event.decode("utf-8", errors="replace").splitlines():
            if line.startswith("data:"):
                payloads.append(line[5:].strip())
    return payloads, buffer


class EventStream(QObject):
    """One request answered with server-sent events: `event` for each JSON event as it arrives (`[DONE]`
    and payloads that are not JSON objects are skipped), then `ended` once, with the failure of the
    request in words ("" when it ran to its end or was aborted; a refusal before streaming is a JSON
    error body, read with `reply_error`)."""

    event = Signal(dict)
    ended = Signal(str)

    def __init__(self, reply: QNetworkReply, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._reply = reply
        self._buffer = b""
        self.aborted = False
        self.done = False
        reply.readyRead.connect(self._read)
        reply.finished.connect(self._finished)

    def abort(self) -> None:
        if not self.done:
            self.aborted = True
            self._reply.abort()

    def _read(self) -> None:
        payloads, self._buffer = sse_data(self._buffer + bytes(self._reply.readAll()))
        for data in payloads:
            if data == "[DONE]":
                continue
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.event.emit(event)

    def _finished(self) -> None:
        if self.done:
            return
        self.done = True
        if not self.aborted:  # an aborted reply is closed: nothing more to read
            self._read()
        reply = self._reply
        failed = reply.error() != QNetworkReply.NetworkError.NoError and not self.aborted
        self.ended.emit(reply_error(reply, self._buffer) if failed else "")
        reply.deleteLater()


class ChatStream(QObject):
    """One streamed chat completion, its events as text deltas, then how it ended."""

    delta = Signal(str)
    piece = Signal(str, list)  # the delta's text and its tokens' `speculative_tokens` flags (may be empty)
    finished = Signal(str, dict)  # finish reason ("stop", "length", "aborted"), usage
    failed = Signal(str)

    def __init__(self, events: EventStream, body: bytes, parent: QObject | None = None) -> None:
        super().__init__(parent)
        events.setParent(self)
        self._events = events
        self._finish = ""
        self._usage: dict[str, Any] = {}
        self._error = ""
        self.body = body  # the request as sent (JSON)
        events.event.connect(self._event)
        events.ended.connect(self._ended)

    def abort(self) -> None:
        self._events.abort()

    def _event(self, chunk: dict[str, Any]) -> None:
        error = event_error(chunk)
        if error is not None:
            self._error = error
            return
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        flags = [bool(f) for f in chunk.get("speculative_tokens") or ()]
        for choice in chunk.get("choices", []):
            text = (choice.get("delta") or {}).get("content")
            if text:
                self.delta.emit(text)
                self.piece.emit(text, flags)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]

    def _ended(self, failure: str) -> None:
        if self._events.aborted:
            self.finished.emit("aborted", self._usage)
        elif self._error:
            self.failed.emit(self._error)
        elif failure and not self._finish:  # a connection lost after the last token loses nothing
            self.failed.emit(failure)
        else:
            self.finished.emit(self._finish or "stop", self._usage)


class JsonReply(QObject):
    """One JSON request to the engine: `done` with the decoded body, or `failed` with the server's message."""

    done = Signal(dict)
    failed = Signal(str)

    def __init__(self, reply: QNetworkReply, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._reply = reply
        reply.finished.connect(self._finished)

    def _finished(self) -> None:
        reply = self._reply
        body = bytes(reply.readAll())
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = {}
        if reply.error() == QNetworkReply.NetworkError.NoError and isinstance(data, dict):
            self.done.emit(data)
        else:
            self.failed.emit(reply_error(reply, body))
        reply.deleteLater()


class EngineClient(QObject):
    """Requests to one engine (its base URL and bearer token change when the engine restarts)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._manager = QNetworkAccessManager(self)
        self.base_url = ""
        self.token = ""

    def configure(self, base_url: str, token: str) -> None:
        self.base_url, self.token = base_url, token

    def _request(self, path: str) -> QNetworkRequest:
        request = QNetworkRequest(QUrl(f"{self.base_url}{path}"))
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        request.setRawHeader(b"Authorization", f"Bearer {self.token}".encode())
        return request

    def get_json(self, path: str) -> JsonReply:
        return JsonReply(self._manager.get(self._request(path)), self)

    def post_json(self, path: str, body: dict[str, Any]) -> JsonReply:
        return JsonReply(self._manager.post(self._request(path), json.dumps(body).encode()), self)

    def delete(self, path: str) -> JsonReply:
        return JsonReply(self._manager.deleteResource(self._request(path)), self)

    def post_events(self, path: str, data: bytes) -> EventStream:
        """POST a JSON body to a route that answers with server-sent events."""
        request = self._request(path)
        request.setRawHeader(b"Accept", b"text/event-stream")
        return EventStream(self._manager.post(request, data), self)

    def stream_chat(self, messages: list[dict[str, Any]], **params: Any) -> ChatStream:
        body = {
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **{k: v for k, v in params.items() if v is not None},
        }
        data = json.dumps(body).encode()
        return ChatStream(self.post_events("/v1/chat/completions", data), data, self)
