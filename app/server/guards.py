"""The checks before any route runs: closing, Host (DNS rebinding), Origin and body type (web pages), keys;
and who the client is, for admission and KV slots."""

from __future__ import annotations

import contextvars
import hashlib
import hmac
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.errors import APIError
from app.server.hosts import host_name
from app.server.state import AppState

ADMIN_DISABLED = "admin routes are disabled: start the engine with FORESIGHT_ADMIN_TOKEN set or --token-stdin"
PRIVATE_ONLY = ("/admin", "/props")  # absent on the public listener (/props shows local paths)
OPEN_PATHS = ("/", "/health")  # answered without a key: they say only whether the engine is up
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPES = frozenset({"application/json"})
WINDOW_CLIENT = "window"


@dataclass(frozen=True)
class Caller:
    """Who sent the request being handled, and its ASGI receive (it says when that client has gone)."""

    client: str
    receive: Receive | None = None


_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("foresight_caller", default=None)


def key_matches(given: str, keys: tuple[str, ...]) -> bool:
    """A presented key against each key, in constant time."""
    match = False
    for key in keys:
        match |= hmac.compare_digest(given.strip().encode(), key.encode())
    return match and bool(given.strip())


def presented_key(headers: Headers) -> str:
    """`Authorization: Bearer <key>` (OpenAI clients) or `x-api-key: <key>` (Anthropic clients)."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        return given
    return headers.get("x-api-key", "")


def client_identity(state: AppState, headers: Headers, address: str) -> str:
    """Who sent a request: the desktop window (its per-launch token), else an API key (as a hash: a key is
    never kept or logged), else the remote address. Each is one client for admission and KV slots."""
    given = presented_key(headers)
    if state.admin_token and key_matches(given, (state.admin_token,)):
        return WINDOW_CLIENT
    if state.api_key and key_matches(given, (state.api_key,)):
        return "key:" + hashlib.sha256(state.api_key.encode()).hexdigest()[:16]
    return f"address:{address}"


def current_caller() -> Caller:
    """The caller of the request being handled (set by the Guard before any route runs)."""
    return _caller.get() or Caller("")


def _has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers


class Guard:
    """Refuses a request before any route runs; /health and / stay open to anyone who passes the Host check.

    A web page can POST to a local port without a CORS preflight when the body is a "simple" type
    (text/plain, a form): a body that is not JSON gets 415, and a browser's Origin other than the one
    configured (server.cors_origin) gets 403, whatever the route.
    """

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._check(scope)
            if error is not None:
                await error.response(scope["path"])(scope, receive, send)
                return
            address = (scope.get("client") or ("unknown", 0))[0]
            _caller.set(Caller(client_identity(self.state, Headers(scope=scope), address), receive))
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> APIError | None:
        state, path = self.state, scope["path"]
        if state.closing:
            return APIError(503, "this listener is shutting down", "server_shutting_down")
        headers = Headers(scope=scope)
        if host_name(headers.get("host", "")) not in state.allowed_hosts:
            return APIError(400, "this Host is not served (DNS rebinding protection)", "invalid_host")
        origin = headers.get("origin")
        allowed_origin = (state.settings.server.cors_origin or "").rstrip("/")
        if origin is not None and (not allowed_origin or origin.rstrip("/") != allowed_origin):
            return APIError(403, f"requests from the web origin {origin} are not allowed", "forbidden_origin")
        if scope["method"] in BODY_METHODS and _has_body(headers):
            media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media_type not in JSON_TYPES:
                return APIError(
                    415,
                    f"the body must be application/json, not {media_type or 'untyped'}",
                    "unsupported_media_type",
                )
        if state.public and path.startswith(PRIVATE_ONLY):
            return APIError(404, "Not Found", "not_found")
        if path == "/admin" or path.startswith("/admin/"):
            if state.admin_token is None:
                return APIError(404, ADMIN_DISABLED, "not_found")
            keys: tuple[str, ...] = (state.admin_token,)
        else:
            keys = tuple(k for k in (state.api_key, state.admin_token) if k)
        if keys and path not in OPEN_PATHS and not key_matches(presented_key(headers), keys):
            return APIError(
                401,
                "missing or wrong API key (Authorization: Bearer <key>, or x-api-key: <key>)",
                "unauthorized",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None
