"""The GUI's admin routes on the private listener: the public listener on/off, load/unload a pair."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from app.addresses import is_loopback
from app.config import ConfigError, Settings
from app.engine.errors import EngineError
from app.server.app import create_app
from app.server.errors import APIError, error_event, from_engine_error, parse_body
from app.server.jobs import event_stream, model_id, read_body
from app.server.listeners import Listener, bind
from app.server.runner.base import END, Busy, Events, Runner, ShuttingDown, Stage
from app.server.runner.load import LoadRequest
from app.server.state import AppState

log = logging.getLogger("foresight.admin")


class Admin:
    """What the admin routes act on: the worker, the settings, and the public listener when one is open."""

    def __init__(self, worker: Runner, settings: Settings) -> None:
        self.worker = worker
        self.settings = settings
        self.public: Listener | None = None
        self._lock = asyncio.Lock()

    def public_info(self) -> dict[str, Any]:
        return self.public.info() if self.public is not None else {"open": False}

    async def open_public(self, host: str, port: int, api_key: str | None) -> dict[str, Any]:
        """Open (or reopen elsewhere) the public listener; a LAN bind needs an API key."""
        if not is_loopback(host) and not api_key:
            message = f"a public listener on {host} (not loopback) needs an api_key"
            raise APIError(400, message, "invalid_request_error", "api_key")
        async with self._lock:
            # Bind the new socket first, so a taken port leaves the old listener serving; only a
            # reopen on the old listener's own port has to close it first.
            if self.public is not None and port == self.public.port:
                await self._close_public()
            try:
                sock = bind(host, port)
            except ConfigError as exc:
                raise APIError(409, str(exc), "listen_failed", "port") from None
            await self._close_public()
            make = functools.partial(
                create_app, self.worker, self.settings, api_key, sock.getsockname()[1], host=host, public=True
            )
            try:
                app = await anyio.to_thread.run_sync(make)  # a LAN bind looks up this machine's names (DNS)
                listener = Listener(app, sock, host)
                await listener.start()
            except BaseException:
                sock.close()
                raise
            self.public = listener
            log.info("public listener open on %s:%d (API key: %s)", host, listener.port, bool(api_key))
            return listener.info()

    async def close_public(self) -> dict[str, Any]:
        async with self._lock:
            await self._close_public()
        return self.public_info()

    async def _close_public(self) -> None:
        listener, self.public = self.public, None
        if listener is not None:
            await listener.close()
            log.info("public listener on port %d closed", listener.port)


# --- routes -----------------------------------------------------------------------------------------
router = APIRouter(prefix="/admin")


class PublicRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", min_length=1, description="bind address (not loopback: needs api_key)")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0: the OS picks one; the reply says)")
    api_key: str | None = Field(None, min_length=1, description="Bearer key the listener asks for")


class LoadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str = Field(min_length=1, description="target GGUF: a path or a packaged model's key")
    draft: str | None = Field(None, min_length=1, description="drafter GGUF (a path or a packaged key)")
    ngram: bool = Field(False, description="draft by n-gram prompt lookup (without draft or ngram: none)")
    mmproj: str | None = Field(None, min_length=1, description="the target's vision projector GGUF (mmproj)")


def _admin(request: Request) -> Admin:
    return request.app.state.admin


def mount(app: FastAPI, admin: Admin) -> None:
    """Give the private listener's app the admin routes."""
    app.state.admin = admin
    app.include_router(router)


@router.get("/public")
async def public_state(request: Request) -> Response:
    return JSONResponse(_admin(request).public_info())


@router.post("/public")
async def open_public(request: Request) -> Response:
    body = parse_body(PublicRequest, await read_body(request))
    return JSONResponse(await _admin(request).open_public(body.host, body.port, body.api_key))


@router.delete("/public")
async def close_public(request: Request) -> Response:
    return JSONResponse(await _admin(request).close_public())


async def _model_file(name: str, param: str) -> Path:
    """A model argument as an existing file, checked before anything is unloaded."""
    from app.catalog.packaged import ModelPackageMissing, resolve_model

    try:
        path = await anyio.to_thread.run_sync(resolve_model, name)
    except (ModelPackageMissing, RuntimeError, OSError, ValueError) as exc:  # ~nosuchuser/x: RuntimeError
        raise APIError(400, f"{name}: {exc}", "invalid_request_error", param) from None
    if not path.is_file():
        raise APIError(400, f"{param}: no such model file: {path}", "invalid_request_error", param)
    return path


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _load_error(exc: BaseException) -> APIError:
    if isinstance(exc, ShuttingDown):
        return APIError(503, str(exc), "server_shutting_down")
    if isinstance(exc, EngineError):
        return from_engine_error(exc)
    return APIError(500, f"loading failed: {type(exc).__name__}: {exc}", "model_load_failed")


def _start(start: Any) -> Any:
    try:
        return start()
    except Busy as exc:
        raise APIError(409, str(exc), "model_busy") from None
    except ShuttingDown as exc:
        raise APIError(503, str(exc), "server_shutting_down") from None


@router.post("/load")
async def load(request: Request) -> Response:
    """Load another target/drafter pair; the stages stream as SSE: {"stage": ...}, or {"error": ...}."""
    admin = _admin(request)
    body = parse_body(LoadBody, await read_body(request))
    if body.draft and body.ngram:
        raise APIError(400, "give draft or ngram, not both", "invalid_request_error", "ngram")
    target = await _model_file(body.target, "target")
    draft = await _model_file(body.draft, "draft") if body.draft else None
    mmproj = await _model_file(body.mmproj, "mmproj") if body.mmproj else None
    mode = "model" if draft else "ngram" if body.ngram else "none"
    events = _start(lambda: admin.worker.load(LoadRequest.of(admin.settings, target, draft, mode, mmproj)))
    return event_stream(_stages(events, admin, request.app.state.foresight))


async def _stages(events: Events, admin: Admin, state: AppState) -> AsyncIterator[str]:
    """A load's stages as events; the last, "ready", with what was loaded."""
    while (item := await anyio.to_thread.run_sync(events.get, abandon_on_cancel=True)) is not END:
        if isinstance(item, BaseException):
            yield error_event(_load_error(item))
        elif isinstance(item, Stage):
            payload: dict[str, Any] = {"stage": item.name, "elapsed_s": item.elapsed_s}
            if item.name == "ready" and admin.worker.props is not None:
                props = admin.worker.props
                payload.update(
                    model=model_id(state),
                    draft=props["draft"]["source"],
                    context_length=props["target"]["n_ctx"],
                    vision=props.get("vision", False),
                )
            yield _event(payload)
    yield "data: [DONE]\n\n"


@router.post("/unload")
async def unload(request: Request) -> Response:
    """Close the models and free their memory; generation routes answer 503 model_not_loaded until a load."""
    admin = _admin(request)
    events = _start(admin.worker.unload)
    while (item := await anyio.to_thread.run_sync(events.get, abandon_on_cancel=True)) is not END:
        if isinstance(item, BaseException):
            raise _load_error(item)
    return JSONResponse({"status": admin.worker.state})
