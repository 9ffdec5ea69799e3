"""HTTP/SSE client for the engine's OpenAI-compatible API, on Qt's event loop (no threads).

`ChatStream` posts one streamed chat completion and turns the server-sent events into signals: text
deltas as they arrive (`piece` adds the engine's per-token accepted-draft flags), then `finished` with
the finish reason and usage (speculation stats included), or `failed` with the server's error message.
`abort()` closes the connection, which cancels the generation on the engine within one step.
"""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest


class ChatStream(QObject):
    delta = Signal(str)
    piece = Signal(str, list)  # the delta's text and its tokens' `speculative_tokens` flags (may be empty)
    finished = Signal(str, dict)  # finish reason ("stop", "length", "aborted"), usage
    failed = Signal(str)

    def __init__(
        self, manager: QNetworkAccessManager, reply: QNetworkReply, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._manager = manager
        self._reply = reply
        self._buffer = b""
        self._finish = ""
        self._usage: dict[str, Any] = {}
        self._error = ""
        self._aborted = False
        self._ended = False
        self.body = b""  # the request as sent (JSON)
        reply.readyRead.connect(self._read)
        reply.finished.connect(self._done)

    def abort(self) -> None:
        if not self._ended:
            self._aborted = True
            self._reply.abort()

    def _read(self) -> None:
        events, self._buffer = sse_data(self._buffer + bytes(self._reply.readAll()))
        for data in events:
            self._event(data)

    def _event(self, data: str) -> None:
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        if "error" in chunk:
            self._error = str(chunk["error"].get("message", chunk["error"]))
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

    def _done(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._read()
        reply = self._reply
        status = reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute)
        if self._aborted:
            self.finished.emit("aborted", self._usage)
        elif self._error:
            self.failed.emit(self._error)
        elif reply.error() != QNetworkReply.NetworkError.NoError and not self._finish:
            body = self._buffer.decode("utf-8", errors="replace")
            try:
                message = json.loads(body)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = reply.errorString()
            self.failed.emit(f"{message} (HTTP {status})" if status else message)
        else:
            self.finished.emit(self._finish or "stop", self._usage)
        reply.deleteLater()


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
        status = reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute)
        body = bytes(reply.readAll()).decode("utf-8", errors="replace")
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = {}
        if reply.error() == QNetworkReply.NetworkError.NoError and isinstance(data, dict):
            self.done.emit(data)
        else:
            try:
                message = str(data["error"]["message"])
            except (KeyError, TypeError):
                message = reply.errorString()
            self.failed.emit(f"{message} (HTTP {status})" if status else message)
        reply.deleteLater()


def sse_data(buffer: bytes) -> tuple[list[str], bytes]:
    """The `data:` payloads of the complete server-sent events in `buffer`, and what is left of it."""
    payloads = []
    while b"\n\n" in buffer:
        event, buffer = buffer.split(b"\n\n", 1)
        for line in event.decode("utf-8", errors="replace").splitlines():
            if line.startswith("data:"):
                payloads.append(line[5:].strip())
    return payloads, buffer


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

    def post_events(self, path: str, data: bytes) -> QNetworkReply:
        """POST a JSON body to a route that answers with server-sent events."""
        request = self._request(path)
        request.setRawHeader(b"Accept", b"text/event-stream")
        return self._manager.post(request, data)

    def stream_chat(self, messages: list[dict[str, Any]], **params: Any) -> ChatStream:
        body = {
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **{k: v for k, v in params.items() if v is not None},
        }
        data = json.dumps(body).encode()
        stream = ChatStream(self._manager, self.post_events("/v1/chat/completions", data), self)
        stream.body = data
        return stream
