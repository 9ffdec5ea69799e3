"""Prompts for the loaded target: raw text, fill-in-the-middle, chat through its template, images in chat."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.config import EngineSettings
from app.engine.backends.base import Backend
from app.engine.chat import ChatFormat
from app.engine.errors import InvalidRequest
from app.engine.vision import (
    IMAGE_POSITION,
    ImageError,
    ImageLimits,
    MediaPrompt,
    NoVision,
    Vision,
    image_parts,
    read_image_part,
)


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str
    draft_prompt: bytes | None  # the drafter's own rendering, for cross-vocabulary drafting
    media: MediaPrompt | None = None  # images: tokens holds IMAGE_POSITION where they sit

    def close(self) -> None:
        if self.media is not None:
            self.media.close()


class Prompts:
    """Renders requests into the target's tokens (and the drafter's own text where its vocabulary differs).

    draft_chat: the drafter model's chat format, for cross-vocabulary drafting; vision: the target's
    projector (None: it reads no images); settings: the image limits.
    """

    def __init__(
        self,
        target: Backend,
        chat: ChatFormat,
        settings: EngineSettings,
        draft_chat: ChatFormat | None = None,
        vision: Vision | None = None,
    ) -> None:
        self.target = target
        self.chat = chat
        self.settings = settings
        self.draft_chat = draft_chat
        self.vision = vision

    def tokenize_text(self, text: str) -> list[int]:
        return self.target.tokenize(text.encode("utf-8"), True, False)

    def render_text(self, text: str) -> Prompt:
        """Raw text to complete as is, without the chat template."""
        return Prompt(self.tokenize_text(text), text, None)

    def render_fim(self, prefix: str, suffix: str) -> Prompt:
        """Fill-in-the-middle: the text before and after the gap, framed by the model's FIM tokens.

        A model without FIM tokens refuses a suffix; an empty one leaves a plain completion of the prefix.
        """
        fim = self.target.fim_tokens()
        if fim is None:
            if suffix:
                raise InvalidRequest("model does not support fill-in-the-middle (suffix)")
            return self.render_text(prefix)
        pre, suf, mid = fim
        t = self.target
        before, after = (t.tokenize(s.encode("utf-8"), False, False) for s in (prefix, suffix))
        tokens = [pre, *before, suf, *after, mid]
        if t.vocab.add_bos:
            tokens.insert(0, t.vocab.bos)
        text = f"{t.token_text(pre)}{prefix}{t.token_text(suf)}{suffix}{t.token_text(mid)}"
        return Prompt(tokens, text, None)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        prefill: str = "",
    ) -> Prompt:
        """The chat template's prompt; `prefill` is assistant text the reply is made to begin with.

        Image parts become the projector's marker in the text, and libmtmd tokenizes the images there.
        """
        images = image_parts(messages)
        if images:
            return self._with_images(messages, images, tools, prefill)
        text = self.chat.render(messages, tools) + prefill
        tokens = self.target.tokenize(text.encode("utf-8"), True, True)
        draft_prompt = None
        if self.draft_chat is not None:
            draft_prompt = (self.draft_chat.render(messages) + prefill).encode("utf-8")
        return Prompt(tokens, text, draft_prompt)

    def _with_images(
        self,
        messages: Sequence[Mapping[str, Any]],
        images: list[tuple[int, int, Mapping[str, Any]]],
        tools: Sequence[Mapping[str, Any]] | None,
        prefill: str,
    ) -> Prompt:
        first_i, first_j, _ = images[0]
        if self.vision is None:
            raise NoVision(f"messages[{first_i}].content[{first_j}]")
        es = self.settings
        if len(images) > es.max_images:
            i, j, _ = images[es.max_images]
            raise ImageError(
                f"at most {es.max_images} images are taken per request", f"messages[{i}].content[{j}]"
            )
        limits = ImageLimits(es.max_image_bytes, es.max_image_pixels, es.max_images)
        read = [read_image_part(part, f"messages[{i}].content[{j}]", limits) for i, j, part in images]
        # the images of one request are decoded at once: their pixels together stay under the limit
        if sum(r.width * r.height for r in read) > es.max_image_pixels:
            raise ImageError(
                f"the images hold more than {es.max_image_pixels} pixels together", read[-1].param
            )
        marker = {"type": "text", "text": self.vision.marker}
        at = {(i, j) for i, j, _ in images}
        templated = [
            dict(m, content=[marker if (i, j) in at else p for j, p in enumerate(m["content"])])
            if isinstance(m.get("content"), list)
            else m
            for i, m in enumerate(messages)
        ]
        text = self.chat.render(templated, tools) + prefill
        if text.count(self.vision.marker) != len(read):
            raise InvalidRequest(f"the text of the messages holds the image marker {self.vision.marker!r}")
        media = self.vision.tokenize(text, read)
        if media.tokens[-1] == IMAGE_POSITION:  # the answer starts after a text token, never an image
            media.close()
            raise InvalidRequest("the prompt ends on an image: put text (or the assistant's turn) after it")
        return Prompt(media.tokens, text, None, media)
