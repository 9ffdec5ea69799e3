"""What every route of one listener shares: the worker, its admission, the settings, what its guards check."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

from fastapi import Request

from app.config import Settings
from app.server.admission import Admission
from app.server.runner.base import Job, Runner


@dataclass
class AppState:
    """Everything the routes share: the worker, its admission (one for all listeners), the settings and what
    the guards check."""

    worker: Runner
    admission: Admission
    settings: Settings
    api_key: str | None
    allowed_hosts: frozenset[str]  # Host header names (without port) this listener answers to
    port: int | None = None  # the bound port (settings may say 0)
    admin_token: str | None = None  # the GUI's per-launch token: /admin routes, and a key for every route
    public: bool = False  # the public listener: no /admin, no /props
    loopback: bool = True  # bound to a loopback address only (else /props and /health hide local paths)
    closing: bool = False  # new requests get 503 while the listener shuts down
    jobs: weakref.WeakSet[Job] = field(default_factory=weakref.WeakSet)  # cancelled when it closes
    started: int = field(default_factory=lambda: int(time.time()))


def app_state(request: Request) -> AppState:
    return request.app.state.foresight
