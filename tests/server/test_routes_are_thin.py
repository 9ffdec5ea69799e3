"""Routes parse and delegate: every route function of the engine's app is at most 30 lines."""

from __future__ import annotations

import inspect

import pytest
from fastapi import APIRouter
from fastapi.routing import APIRoute

from app.server import admin
from app.server import app as server_app
from app.server.anthropic import routes as anthropic
from app.server.openai import routes as openai

MAX_LINES = 30
ROUTERS: list[APIRouter] = [server_app.router, openai.router, anthropic.router, admin.router]
ROUTES = [route for router in ROUTERS for route in router.routes if isinstance(route, APIRoute)]


def test_every_dialect_has_its_routes() -> None:
    paths = {route.path for route in ROUTES}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"} <= paths
    assert {
        "/v1/messages/count_tokens",
        "/v1/models",
        "/health",
        "/props",
        "/metrics",
        "/admin/load",
    } <= paths


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{','.join(sorted(r.methods))} {r.path}")
def test_a_route_is_at_most_30_lines(route: APIRoute) -> None:
    lines, _ = inspect.getsourcelines(route.endpoint)
    assert len(lines) <= MAX_LINES, f"{route.endpoint.__qualname__} is {len(lines)} lines"
