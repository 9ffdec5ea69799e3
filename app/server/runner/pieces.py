"""A generation's chunks as the routes get them: with their tokens' logprobs, the last with its stop."""

from __future__ import annotations

from app.engine.engine import Engine
from app.engine.generation import Chunk
from app.engine.sampling import TokenLogprob
from app.server.runner.base import Job, Logprob, Piece


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
