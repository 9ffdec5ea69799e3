"""The engine's FastAPI app for one listener: the dialects' routers, the guards, and the routes of no dialect
(/, /health, /props, /metrics)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from app.addresses import is_loopback
from app.config import Settings
from app.engine.errors import EngineError
from app.server import admission
from app.server.anthropic import routes as anthropic
from app.server.errors import APIError, render_error
from app.server.fields import accepted_ignored
from app.server.guards import Guard
from app.server.hosts import allowed_hosts, machine_names
from app.server.jobs import not_loaded
from app.server.openai import routes as openai
from app.server.runner.base import Runner
from app.server.state import AppState, app_state

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"])
async def root(request: Request) -> Response:
    """Clients probe the base address before they start (Claude Code sends HEAD /)."""
    return JSONResponse({"name": "Foresight engine", "status": app_state(request).worker.state})


@router.get("/health")
async def health(request: Request) -> Response:
    state = app_state(request)
    worker = state.worker
    status = {"ready": "ok"}.get(worker.state, worker.state)
    body: dict[str, Any] = {"status": status}
    if worker.load_error is not None and not state.public and state.loopback:  # it names local paths
        body["message"] = str(worker.load_error)
    return JSONResponse(body, 200 if status == "ok" else 503)


def without_paths(props: dict[str, Any]) -> dict[str, Any]:
    """/props for a listener other machines can reach: file names instead of local paths."""
    out = dict(props)
    for section in ("target", "draft", "projector"):
        part = out.get(section)
        if isinstance(part, dict) and isinstance(part.get("path"), str):
            out[section] = {**part, "path": part["path"].replace("\\", "/").rsplit("/", 1)[-1]}
    return out


@router.get("/props")
async def props(request: Request) -> Response:
    state = app_state(request)
    if state.worker.props is None:
        raise not_loaded(state.worker.state)
    server = state.settings.server.model_dump()
    server.update(auth=state.api_key is not None, queue_depth=state.worker.queue_depth)
    if state.port is not None:
        server["port"] = state.port
    body = state.worker.props if state.loopback else without_paths(state.worker.props)
    return JSONResponse({**body, "server": server, "accepted_ignored": accepted_ignored()})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = app_state(request)
    worker = state.worker
    text = worker.metrics.prometheus(worker.queue_depth) + state.admission.prometheus()
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def create_app(
    worker: Runner,
    settings: Settings,
    api_key: str | None = None,
    port: int | None = None,
    *,
    host: str | None = None,
    admin_token: str | None = None,
    public: bool = False,
) -> FastAPI:
    """One listener's app over the shared runner; `host` is its bind address (default: settings')."""
    server = settings.server
    host = server.host if host is None else host
    lan = machine_names() if api_key and not is_loopback(host) else ()
    allowed = allowed_hosts(host, bool(api_key), lan)
    state = AppState(
        worker,
        admission.for_worker(worker, server.queue_size, server.per_client),
        settings,
        api_key,
        allowed,
        port,
        admin_token=admin_token,
        public=public,
        loopback=is_loopback(host),
    )
    app = FastAPI(title="Foresight engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.foresight = state
    for routes in (router, openai.router, anthropic.router):
        app.include_router(routes)
    for kind in (APIError, EngineError, HTTPException, Exception):
        app.add_exception_handler(kind, render_error)
    app.add_middleware(Guard, state=state)
    if server.cors_origin:  # outermost, so that preflight requests are answered before the key check
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[server.cors_origin],
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        )
    return app
