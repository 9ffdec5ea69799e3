"""Loading a pair into the running engine: POST /admin/load, read as server-sent events by the client's
EventStream."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.services.client import EngineClient, event_error


class LoadStream(QObject):
    """One POST /admin/load: `stage` for each stage the engine reports, then `done` with the "ready"
    event (model, draft, context_length) or `failed` with the engine's message."""

    stage = Signal(str)
    done = Signal(dict)
    failed = Signal(str)

    def __init__(self, client: EngineClient, body: dict[str, Any], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ready: dict[str, Any] | None = None
        self._error = ""
        self._events = client.post_events("/admin/load", json.dumps(body).encode())
        self._events.setParent(self)
        self._events.event.connect(self._event)
        self._events.ended.connect(self._ended)

    def _event(self, event: dict[str, Any]) -> None:
        error = event_error(event)
        if error is not None:
            self._error = error
        elif "stage" in event:
            self.stage.emit(str(event["stage"]))
            if event["stage"] == "ready":
                self._ready = event

    def _ended(self, failure: str) -> None:
        error = self._error or failure  # refused before streaming: bad path, busy, bad token
        if error:
            self.failed.emit(error)
        elif self._ready is not None:
            self.done.emit(self._ready)
        else:
            self.failed.emit("the engine ended the load without saying it was ready")


def load_pair(
    client: EngineClient,
    target: str,
    draft: str | None = None,
    ngram: bool = False,
    parent: QObject | None = None,
    mmproj: str | None = None,
) -> LoadStream:
    """Ask the running engine to load `target` with a drafter model, n-gram drafting, or neither, and
    with a vision projector when `mmproj` is given."""
    body = {"target": target, "draft": draft, "ngram": bool(ngram and not draft), "mmproj": mmproj}
    return LoadStream(client, body, parent)
