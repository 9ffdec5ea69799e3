"""The generation loop: prefill with KV reuse, speculative steps chosen by the policy, stopping, streaming.

A generation is a Stream of steps, so that a batch can run several side by side (batching.py).
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from app.engine.backends.base import Backend
from app.engine.drafting.drafters import common_prefix
from app.engine.drafting.step import PLAIN, Drafting, Speculation
from app.engine.errors import ContextLengthExceeded, InvalidRequest
from app.engine.sampling import Sampler, SamplingParams
from app.engine.speculative import StepResult, accept_best, accept_rows, sampled_rows, verify
from app.engine.stats import SpecStats

if TYPE_CHECKING:
    from app.engine.vision import MediaPrompt

StepHook = Callable[[list[int]], None]  # called after each step with the committed tokens (last: pending)


@dataclass
class Chunk:
    """What one step adds to the output."""

    text: str
    tokens: list[int]
    from_draft: list[bool]  # per token: an accepted draft token (the GUI highlights these)
    finish_reason: str | None = None  # stop | length | cancelled
    stats: SpecStats | None = None  # on the last chunk only


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """One generation; built by keyword, and derived with dataclasses.replace."""

    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    stop: Sequence[str] = ()
    draft_prompt: bytes | None = None  # the drafter's own rendering of the prompt (cross-vocabulary)
    speculative: bool = True
    media: MediaPrompt | None = None  # images in the prompt: libmtmd fills their positions
    # a seeded sampled request whose text must not depend on the cache or on drafting (the API's promise;
    # see reproducible()): it decodes plainly, alone in an emptied cache
    reproducible: bool = False


class _TextOutput:
    """Incremental UTF-8 decoding with stop strings: text that could start a stop string is held back."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def add(self, piece: bytes) -> None:
        before = len(self.text)
        self.text += self._decoder.decode(piece)
        if self.stop:
            scan_from = max(0, before - self._hold)
            hits = [i for s in self.stop if (i := self.text.find(s, scan_from)) >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True

    def flush(self, final: bool) -> str:
        if final:
            if not self.stopped:
                self.text += self._decoder.decode(b"", final=True)
            end = len(self.text)
        else:
            end = len(self.text) - self._held_back()
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def _held_back(self) -> int:
        for n in range(min(self._hold, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0


class _Answer:
    """The tokens and text committed so far, and the limits that end a generation."""

    def __init__(self, target: Backend, prompt: list[int], request: GenerationRequest) -> None:
        self.target = target
        self.committed = prompt  # ends with the pending token once generation starts; KV holds committed[:-1]
        self.max_tokens = request.max_tokens
        self.out = _TextOutput(request.stop)
        self.generated = 0

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.generated

    @property
    def room(self) -> int:
        """Draft tokens that could still be kept: within max_tokens and the context."""
        return min(self.remaining - 1, self.context_room)

    @property
    def context_room(self) -> int:
        """Tokens the context still takes after the pending one."""
        return self.target.n_ctx - len(self.committed) - 1

    def commit(self, tokens: list[int], flags: list[bool]) -> tuple[list[int], list[bool], str | None]:
        """What a step produced, up to end-of-generation, a stop string or a limit; and the finish reason."""
        kept_tokens: list[int] = []
        kept_flags: list[bool] = []
        for token, flag in zip(tokens, flags, strict=True):
            if self.target.is_eog(token):
                return kept_tokens, kept_flags, "stop"
            self.committed.append(token)
            kept_tokens.append(token)
            kept_flags.append(flag)
            self.generated += 1
            self.out.add(self.target.token_bytes(token))
            if self.out.stopped:
                return kept_tokens, kept_flags, "stop"
            if self.generated >= self.max_tokens or len(self.committed) >= self.target.n_ctx:
                return kept_tokens, kept_flags, "length"
        return kept_tokens, kept_flags, None


def _checked_prompt(target: Backend, request: GenerationRequest) -> list[int]:
    prompt = list(request.prompt)
    if not prompt:
        raise InvalidRequest("the prompt is empty")
    if request.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {request.max_tokens}")
    if len(prompt) >= target.n_ctx:
        raise ContextLengthExceeded(
            f"the prompt has {len(prompt)} tokens but the context holds {target.n_ctx} "
            "(with room for one reply token)"
        )
    return prompt


def reproducible(request: GenerationRequest) -> bool:
    """A seeded sampled request asked to be reproducible: its text must not depend on what the cache held
    or what was drafted (a request without the flag, or greedy, keeps its drafts and its reuse).

    llama.cpp's CPU kernels round a row differently by the pass it sits in (on gemma-3-270m the logits
    move by up to ~1.0 between a prompt fed in one pass or two, and between a verify pass and a plain
    step) and by the cells other sequences hold (0.67), so such a request runs alone in an emptied cache
    (the engine sees to it), decodes plainly, and reuses only a prefix fed as its own cold prefill would.
    """
    return request.reproducible and request.params.seed is not None and not request.params.greedy


SEEDED_PLAIN = "a seeded sampled request decodes plainly: its draws must not depend on drafting"


def _drafting(
    speculation: Speculation | None, request: GenerationRequest, clock: Callable[[], float]
) -> Drafting | None:
    """How this request drafts; None: it decodes plainly."""
    if speculation is None or not request.speculative or reproducible(request):
        return None
    if request.media is not None and speculation.drafter.source != "ngram":
        return None  # a drafter model never saw the image; a lookup in the prompt and the reply still works
    return Drafting(speculation, clock, images=request.media is not None)


def reusable(target: Backend, prompt: list[int], request: GenerationRequest) -> int:
    """How much of the prompt the target's KV may keep: the prefix they share, short of the last token;
    for a reproducible request only what was fed as a cold prefill of this prompt would feed it."""
    reuse = min(common_prefix(target.kv_tokens, prompt), len(prompt) - 1)
    if request.media is not None:
        reuse = min(reuse, request.media.first_image)  # an image is evaluated anew, and so is all after it
    if reproducible(request):
        reuse = min(reuse, target.aligned_prefix())
    return reuse


def _prefill(
    target: Backend, sampler: Sampler, request: GenerationRequest, prompt: list[int], stats: SpecStats
) -> int:
    """Evaluate the prompt where the target's KV does not hold it yet; returns the first reply token."""
    media = request.media
    reuse = reusable(target, prompt, request)
    target.rollback(reuse)
    stats.reused_tokens = reuse
    if media is not None:
        media.prefill(target, reuse)  # up to the last prompt token, which the decode below takes
    elif reuse < len(prompt) - 1:
        target.feed(prompt[reuse:-1])
    # The last prompt token goes alone, whatever the cache held: its logits come from a pass of the same
    # shape cold or cached (llama.cpp rounds a one-row pass differently from a wider one), so a seed gives
    # the same first draw either way.
    if sampler.params.plain_greedy:
        return target.decode_argmax(prompt[-1:], 0)[0]
    rows = sampled_rows(target, sampler, prompt[-1:], 0)
    return sampler.pick(rows[0], prompt)


class Stream:
    """One generation as steps: generate() runs it alone, batching.py side by side with others.

    prefill (or begin, with the first token a batched prefill gave), then per step: advance (commit the
    last step's tokens: a Chunk to send, the last with its finish reason), plan (the next pass's input),
    and step (a pass of its own) or take (rows of a shared pass). The target's selected sequence is this
    stream's while any of these run.
    """

    def __init__(
        self,
        target: Backend,
        request: GenerationRequest,
        speculation: Speculation | None = None,
        cancel: threading.Event | None = None,
        on_step: StepHook | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target = target
        self.request = request
        self.prompt = _checked_prompt(target, request)
        self.drafting = _drafting(speculation, request, clock)
        self.stats = SpecStats(
            draft_source=self.drafting.source if self.drafting else "none", prompt_tokens=len(self.prompt)
        )
        media = request.media
        if media is not None:
            self.stats.images, self.stats.image_tokens = media.images, media.image_tokens
            self.stats.image_mode = "ngram" if self.drafting else "plain"
        if speculation is not None and request.speculative and reproducible(request):
            self.stats.fallback_reason = SEEDED_PLAIN
        self.sampler = Sampler(request.params, target.n_vocab)
        self.cancel = cancel
        self.on_step = on_step
        self.clock = clock
        self.done = False
        self._t0 = clock()
        self._decode_t0 = self._step_t0 = self._t0
        self._answer: _Answer | None = None
        self._pending: tuple[list[int], list[bool]] = ([], [])
        self._draft = PLAIN

    @property
    def committed(self) -> list[int]:
        """Prompt and reply so far, ending with the pending token (not in the KV yet)."""
        return self._answer.committed if self._answer else self.prompt

    @property
    def started(self) -> bool:
        return self._answer is not None

    def prefill(self) -> None:
        """The prompt in a pass (or passes) of its own, and the first reply token from it."""
        self.begin(_prefill(self.target, self.sampler, self.request, self.prompt, self.stats))

    def reuse(self) -> int:
        """For a batched prefill: keep the cached prefix the prompt shares; returns where the rest starts."""
        reuse = reusable(self.target, self.prompt, self.request)
        self.target.rollback(reuse)
        self.stats.reused_tokens = reuse
        return reuse

    def first(self, row: np.ndarray, best: int) -> int:
        """The first reply token from the last prompt token's row (best: that row's argmax)."""
        return best if self.sampler.params.plain_greedy else self.sampler.pick(row, self.prompt)

    def begin(self, first: int) -> None:
        if self.drafting is not None:
            self.drafting.begin(self.prompt, self.request.draft_prompt)
        self.stats.prefill_s = self.clock() - self._t0
        self._answer = _Answer(self.target, self.prompt, self.request)
        self._decode_t0 = self.clock()
        self._pending = ([first], [False])

    def abandon(self) -> Chunk:
        """The final chunk of a stream cancelled before its prompt was read: nothing decoded, nothing sent."""
        self.done = True
        return Chunk("", [], [], "cancelled", self.stats)

    def advance(self) -> Chunk | None:
        """Commit the last step's tokens: the chunk they make (None: nothing to send yet); the final one
        carries the finish reason and the stats, and leaves the stream done."""
        answer = self._answer
        assert answer is not None
        kept_tokens, kept_flags, finish = answer.commit(*self._pending)
        self._pending = ([], [])
        self.stats.emitted = answer.generated
        if finish is None and self.cancel is not None and self.cancel.is_set():
            finish = "cancelled"
        if finish is not None:
            # The pending token never entered the KV; drop drafts past the last committed token.
            self.target.rollback(min(len(self.target.kv_tokens), len(answer.committed) - 1))
            if self.drafting is not None:
                self.drafting.end(answer.committed)
            self.stats.decode_s = self.clock() - self._decode_t0
            self.done = True
            return Chunk(answer.out.flush(final=True), kept_tokens, kept_flags, finish, self.stats)
        text = answer.out.flush(final=False)
        return Chunk(text, kept_tokens, kept_flags) if kept_tokens or text else None

    def plan(self) -> list[int]:
        """The next pass's input: the pending token, then the step's draft (none when it decodes plainly)."""
        answer = self._answer
        assert answer is not None
        self._step_t0 = self.clock()
        self._draft = PLAIN
        if self.drafting is not None:
            self._draft = self.drafting.draft(
                answer.committed, answer.remaining, answer.room, answer.context_room
            )
        return [answer.committed[-1], *self._draft.tokens]

    def step(self) -> None:
        """The planned pass on its own: verify the draft and accept."""
        self._took(verify(self.target, self.sampler, self.committed, self._draft.tokens, self.clock))

    def take(self, rows: np.ndarray, best: list[int], verify_s: float) -> None:
        """The planned pass's rows out of a shared pass (best: their argmaxes); the KV is left holding the
        committed tokens and the accepted drafts."""
        committed, draft = self.committed, self._draft.tokens
        accepted = 0
        try:
            if self.sampler.params.plain_greedy:
                tokens, accepted = accept_best(best, draft)
            else:
                tokens, accepted = accept_rows(self.sampler, list(rows), committed, draft)
        finally:
            self.target.rollback(len(committed) + accepted)
        self._took(StepResult(tokens, accepted, verify_s))

    def _took(self, result: StepResult) -> None:
        committed, draft = self.committed, self._draft
        if self.drafting is None:
            host_s = self.clock() - self._step_t0 - result.verify_s
        else:
            host_s = self.drafting.observe(committed, draft, result, self._step_t0)
        self.stats.record_pass(draft, result, host_s)
        self._pending = (result.tokens, [i < result.accepted for i in range(len(result.tokens))])
        if self.on_step is not None:
            self.on_step(committed + result.tokens)


def generate(
    target: Backend,
    request: GenerationRequest,
    speculation: Speculation | None = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[Chunk]:
    """Generate from request.prompt; the target's KV keeps the committed tokens for reuse by the next call."""
    stream = Stream(target, request, speculation, cancel, on_step, clock)
    stream.prefill()
    while True:
        chunk = stream.advance()
        if chunk is not None:
            yield chunk
        if stream.done:
            return
        stream.plan()
        stream.step()
