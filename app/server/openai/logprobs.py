"""Log-probabilities of emitted tokens in each API's shape: chat, text completions, Responses."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.server.runner.base import Logprob


def _text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None
    refusal: None = None

    @classmethod
    def of(cls, logprobs: list[Logprob] | None) -> ChoiceLogprobs | None:
        if logprobs is None:
            return None
        return cls(content=[_token_logprob(lp) for lp in logprobs])


def _top(token: bytes, logprob: float) -> TopLogprob:
    return TopLogprob(token=_text(token), logprob=logprob, bytes=list(token))


def _token_logprob(lp: Logprob) -> TokenLogprobOut:
    top = [_top(t, v) for t, v in lp.top]
    return TokenLogprobOut(**_top(lp.token, lp.logprob).model_dump(), top_logprobs=top)


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists per token, alternatives as {token: logprob}."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]

    @classmethod
    def of(cls, logprobs: list[Logprob] | None, with_top: bool, offset: int = 0) -> CompletionLogprobs | None:
        if logprobs is None:
            return None
        tokens = [_text(lp.token) for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        top = [{_text(t): v for t, v in lp.top} for lp in logprobs]
        return cls(
            tokens=tokens,
            token_logprobs=[lp.logprob for lp in logprobs],
            top_logprobs=top if with_top else None,
            text_offset=offsets,
        )


def response_logprobs(logprobs: list[Logprob] | None) -> list[dict[str, Any]]:
    """The Responses API's shape: one dict per token, with its bytes and alternatives."""
    return [
        {
            "token": _text(lp.token),
            "bytes": list(lp.token),
            "logprob": lp.logprob,
            "top_logprobs": [{"token": _text(t), "bytes": list(t), "logprob": v} for t, v in lp.top],
        }
        for lp in logprobs or []
    ]
