"""Request fields: each is honoured, taken and ignored (it changes nothing here), or refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from app.server.errors import APIError, parse_body

# Stop strings are bounded: each is matched against the text held back at every token (100,000 stops cost
# 51 ms of host time per token), and the longest one sets how much text the stream holds back. Over either
# limit a request is refused with a 400 naming `stop` (`stop_sequences` on /v1/messages) or its entry.
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 256  # characters per stop string

# Fields clients send that change nothing on a single local model: taken, listed in /props, unused.
CHAT_IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "parallel_tool_calls",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "reasoning_effort",  # no reasoning model is served
        "prediction",  # predicted output only saves time where it matches; the answer is the same
    }
)
COMPLETION_IGNORED = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key"})
MESSAGES_IGNORED = frozenset(
    {
        "metadata",
        "service_tier",
        "thinking",  # the model does not think aloud in blocks
        "cache_control",  # prompts are cached anyway (KV reuse)
        "inference_geo",
        "speed",
        "user_profile_id",
        "workspace_id",
        "diagnostics",
    }
)
RESPONSES_IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",  # responses are not kept, whatever it says
        "parallel_tool_calls",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "reasoning",  # no reasoning model is served
        "include",  # what it asks for (reasoning.encrypted_content, ...) is never produced
        "stream_options",
        "client_metadata",
    }
)
IGNORED_HEADERS = ("anthropic-beta", "anthropic-version")
DROPPED_TOOLS_HEADER = "x-foresight-dropped-tools"  # tools of kinds not served (web search, shells), by name
# In content blocks and tools of Anthropic requests: prompt-cache hints (the KV cache is reused anyway).
IGNORED_BLOCK_KEYS = ("cache_control",)


def accepted_ignored() -> dict[str, Any]:
    """What /props lists: per route, the fields taken and not used, and the headers."""
    blocks = [f"{k} (in blocks and tools)" for k in IGNORED_BLOCK_KEYS]
    return {
        "/v1/chat/completions": [*sorted(CHAT_IGNORED), "stream_options.include_obfuscation"],
        "/v1/completions": [*sorted(COMPLETION_IGNORED), "stream_options.include_obfuscation"],
        "/v1/messages": [
            *sorted(MESSAGES_IGNORED),
            *blocks,
            "output_config.effort",
            "tool_choice.disable_parallel_tool_use",
        ],
        "/v1/responses": [*sorted(RESPONSES_IGNORED), "text.verbosity"],
        "headers": list(IGNORED_HEADERS),
    }


class Lenient(BaseModel):
    """A nested part of a request: keys it does not name are left out (clients add their own)."""

    model_config = ConfigDict(extra="ignore")


class Strict(BaseModel):
    """A request, or a part of one, whose unknown fields are refused by name; `ignored` are taken unused."""

    model_config = ConfigDict(extra="allow")
    ignored: ClassVar[frozenset[str]] = frozenset()


def unknown_fields(model: BaseModel, path: str = "") -> Iterator[str]:
    """The dotted names of fields nobody here reads, in `model` and the Strict models inside it."""
    if isinstance(model, Strict):
        for name in model.model_extra or {}:
            if name not in model.ignored:
                yield f"{path}{name}"
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                where = f"{path}{name}[{i}]." if isinstance(value, list) else f"{path}{name}."
                yield from unknown_fields(item, where)


def parse_request(model: type[BaseModel], raw: bytes) -> Any:
    """A request body as `model`; a field that would be silently dropped is a 400 naming it."""
    body = parse_body(model, raw)
    unknown = list(unknown_fields(body))
    if unknown:
        names = ", ".join(unknown)
        raise APIError(
            400,
            f"unsupported field{'s' if len(unknown) > 1 else ''}: {names} (not honoured by this server)",
            "unsupported_field",
            unknown[0],
        )
    return body


def stop_list(stop: str | list[str] | None, param: str = "stop") -> list[str]:
    """Stop strings as a list, within the limits (MAX_STOP of at most MAX_STOP_CHARS characters)."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    limits = f"at most {MAX_STOP} stop strings of at most {MAX_STOP_CHARS} characters each"
    if len(stops) > MAX_STOP:
        message = f"{param}: {len(stops)} stop strings; this server takes {limits}"
        raise APIError(400, message, "invalid_request_error", param)
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            where = f"{param}[{i}]" if not isinstance(stop, str) else param
            message = f"{where}: a stop string of {len(s)} characters; this server takes {limits}"
            raise APIError(400, message, "invalid_request_error", where)
    return [s for s in stops if s]


def dropped_tools(dropped: list[str]) -> dict[str, str] | None:
    """The response header that names the offered tools left out (None: none was)."""
    return {DROPPED_TOOLS_HEADER: ", ".join(dropped)} if dropped else None
