"""API errors: one exception type, rendered in the shape of the route's API (OpenAI's or Anthropic's)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from app.engine.errors import EngineError, InvalidRequest

log = logging.getLogger("foresight.server")

ANTHROPIC_PATHS = ("/v1/messages",)  # routes that speak Anthropic's API, errors included

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "server_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """An error answered in the route's shape; OpenAI's is {"error": {"message", "type", "code", "param"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        fallback = "server_error" if self.status >= 500 else "invalid_request_error"
        kind = _OPENAI_TYPES.get(self.status, fallback)
        return {"error": {"message": self.message, "type": kind, "code": self.code, "param": self.param}}

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape: {"type": "error", "error": {"type", "message"}}, with our code and param."""
        fallback = "api_error" if self.status >= 500 else "invalid_request_error"
        kind = _ANTHROPIC_TYPES.get(self.status, fallback)
        error = {"type": kind, "message": self.message, "code": self.code}
        if self.param is not None:
            error["param"] = self.param
        return {"type": "error", "error": error}

    def body_for(self, path: str) -> dict[str, Any]:
        return self.anthropic_body() if path.startswith(ANTHROPIC_PATHS) else self.body()

    def response(self, path: str) -> JSONResponse:
        return JSONResponse(self.body_for(path), self.status, headers=self.headers)


def from_engine_error(exc: EngineError) -> APIError:
    """Request errors (bad prompt, too long) are the client's: 400; a failed decode is the server's: 500."""
    status = 400 if isinstance(exc, InvalidRequest) else 500
    return APIError(status, str(exc), exc.code, getattr(exc, "param", None))


def from_validation_error(exc: ValidationError) -> APIError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return APIError(400, f"{param or 'body'}: {first['msg']}", "invalid_request_error", param)


def parse_body(model: type[BaseModel], raw: bytes) -> Any:
    """A request body as `model`; malformed JSON and wrong types are both 400 invalid_request_error."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise APIError(400, "the body is not valid JSON", "invalid_request_error") from exc
        raise from_validation_error(exc) from exc


def as_api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineError):
        return from_engine_error(exc)
    if isinstance(exc, HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return APIError(exc.status_code, str(exc.detail), code)
    return APIError(500, f"internal error: {type(exc).__name__}", "internal_error")


async def render_error(request: Request, exc: Exception) -> Response:
    """The one place that turns exceptions into the route's error shape."""
    error = as_api_error(exc)
    if error.status == 500 and not isinstance(exc, (APIError, EngineError)):
        log.exception("unexpected error on %s", request.url.path, exc_info=exc)
    else:
        log.info("%s %s: %d %s", request.method, request.url.path, error.status, error.message)
    return error.response(request.url.path)


def error_event(error: APIError) -> str:
    return f"data: {json.dumps(error.body())}\n\n"


def stream_error(exc: BaseException) -> APIError:
    """An error after the stream began (the status is already sent): logged, in the error shape."""
    log.info("stream failed: %s", exc)
    if isinstance(exc, EngineError):
        return from_engine_error(exc)
    return APIError(500, f"internal error: {type(exc).__name__}", "internal_error")
