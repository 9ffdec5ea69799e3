"""What every dialect's messages may hold: text and image parts read, any other part refused by name; and
the ids of replies and calls."""

from __future__ import annotations

import uuid
from typing import Any

from app.server.errors import APIError

TEXT_PARTS = ("text", "input_text", "output_text", "refusal")
IMAGE_PARTS = ("image_url", "input_image")


def check_parts(parts: list[Any], param: str) -> None:
    """Text and image parts are read; any other part (audio, files) is refused by name, never dropped."""
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS or kind in IMAGE_PARTS:
            continue
        what = {"input_audio": "audio", "file": "file", "input_file": "file"}.get(str(kind))
        message = f"{what} parts are not supported" if what else f"unknown content part type {kind!r}"
        raise APIError(400, f"{param}[{j}]: {message}", "invalid_request_error", f"{param}[{j}]")


def refuse_images(messages: list[dict[str, Any]], props: dict[str, Any] | None) -> None:
    """An image part sent to a model that cannot see is refused by name, never silently dropped."""
    if props is None or props.get("vision"):
        return  # no model yet: the generation itself answers model_not_loaded
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                raise APIError(
                    400,
                    "the loaded model has no vision: it cannot read images (load it with its vision "
                    "projector, or ask without the image)",
                    "model_has_no_vision",
                    f"messages[{i}].content[{j}]",
                )


def new_id(prefix: str, sep: str = "-") -> str:
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"
