"""A generation's chunks as the routes get them: with their tokens' logprobs, the last with its stop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.engine.generation import Chunk
from app.engine.sampling import TokenLogprob

if TYPE_CHECKING:
    from app.engine.engine import Engine
    from app.server.worker import Job


@dataclass(frozen=True)
class Logprob:
    """An emitted token's log-probability, with the best alternatives: tokens as their bytes."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...]


@dataclass
class Piece(Chunk):
    """A Chunk as the routes get it, with what only the worker can tell them."""

    logprobs: list[Logprob] | None = None  # per token of this piece, when the request asked
    stop_sequence: str | None = None  # on the last piece: the request's stop string that ended it


class Pieces:
    """A generation's chunks as Pieces: each with its tokens' logprobs, the last with its stop string."""

    def __init__(self, engine: Engine, job: Job) -> None:
        self._engine = engine
        self._job = job
        self._trace = job.params.logprobs
        self._used = 0  # trace entries handed out (the sampler also records a final end-of-generation pick)
        self._tokens: list[int] = []
        self._text: list[str] = []

    def of(self, chunk: Chunk) -> Piece:
        logprobs = None
        if self._trace is not None:
            taken = self._trace.tokens[self._used : self._used + len(chunk.tokens)]
            self._used += len(chunk.tokens)
            logprobs = [self._resolved(t) for t in taken]
        self._tokens += chunk.tokens
        self._text.append(chunk.text)
        stop = self._stop_sequence() if chunk.finish_reason == "stop" and self._job.stop else None
        return Piece(
            chunk.text, chunk.tokens, chunk.from_draft, chunk.finish_reason, chunk.stats, logprobs, stop
        )

    def _resolved(self, taken: TokenLogprob) -> Logprob:
        piece = self._engine.target.token_bytes
        return Logprob(piece(taken.token), taken.logprob, tuple((piece(t), lp) for t, lp in taken.top))

    def _stop_sequence(self) -> str | None:
        """The request's stop string the text was cut before (None: the model ended, or a template stop)."""
        whole = b"".join(self._engine.target.token_bytes(t) for t in self._tokens)
        rest = whole.decode("utf-8", errors="replace")[len("".join(self._text)) :]
        return next((stop for stop in self._job.stop if stop and rest.startswith(stop)), None)
