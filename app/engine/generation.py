"""The generation loop: prefill with KV reuse, speculative steps chosen by the policy, stopping, streaming."""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.engine.backends.base import Backend
from app.engine.drafters import common_prefix
from app.engine.drafting import PLAIN, Drafting, Speculation
from app.engine.errors import ContextLengthExceeded, InvalidRequest
from app.engine.sampling import Sampler, SamplingParams
from app.engine.speculative import sampled_rows, verify
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


def _drafting(
    speculation: Speculation | None, request: GenerationRequest, clock: Callable[[], float]
) -> Drafting | None:
    """How this request drafts; None: it decodes plainly."""
    if speculation is None or not request.speculative:
        return None
    if request.media is not None and speculation.drafter.source != "ngram":
        return None  # a drafter model never saw the image; a lookup in the prompt and the reply still works
    return Drafting(speculation, clock, images=request.media is not None)


def _prefill(
    target: Backend, sampler: Sampler, prompt: list[int], media: MediaPrompt | None, stats: SpecStats
) -> int:
    """Evaluate the prompt where the target's KV does not hold it yet; returns the first reply token."""
    reuse = min(common_prefix(target.kv_tokens, prompt), len(prompt) - 1)
    if media is not None:
        reuse = min(reuse, media.first_image)  # an image is evaluated anew, and so is all after it
    target.rollback(reuse)
    stats.reused_tokens = reuse
    if media is not None:
        media.prefill(target, reuse)  # up to the last prompt token, which the decode below takes
        reuse = len(prompt) - 1
    if sampler.params.plain_greedy:
        return target.decode_argmax(prompt[reuse:], len(prompt) - reuse - 1)[0]
    rows = sampled_rows(target, sampler, prompt[reuse:], len(prompt) - reuse - 1)
    return sampler.pick(rows[0], prompt)


def generate(
    target: Backend,
    request: GenerationRequest,
    speculation: Speculation | None = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[Chunk]:
    """Generate from request.prompt; the target's KV keeps the committed tokens for reuse by the next call."""
    prompt = _checked_prompt(target, request)
    media = request.media
    drafting = _drafting(speculation, request, clock)
    stats = SpecStats(draft_source=drafting.source if drafting else "none", prompt_tokens=len(prompt))
    if media is not None:
        stats.images, stats.image_tokens = media.images, media.image_tokens
        stats.image_mode = "ngram" if drafting else "plain"
    sampler = Sampler(request.params, target.n_vocab)

    t0 = clock()
    first = _prefill(target, sampler, prompt, media, stats)
    if drafting is not None:
        drafting.begin(prompt, request.draft_prompt)
    stats.prefill_s = clock() - t0

    answer = _Answer(target, prompt, request)
    decode_t0 = clock()
    step_tokens, step_flags = [first], [False]
    while True:
        kept_tokens, kept_flags, finish = answer.commit(step_tokens, step_flags)
        stats.emitted = answer.generated
        if finish is None and cancel is not None and cancel.is_set():
            finish = "cancelled"
        if finish is not None:
            # The pending token never entered the KV; drop drafts past the last committed token.
            target.rollback(min(len(target.kv_tokens), len(answer.committed) - 1))
            if drafting is not None:
                drafting.end(answer.committed)
            stats.decode_s = clock() - decode_t0
            yield Chunk(answer.out.flush(final=True), kept_tokens, kept_flags, finish, stats)
            return
        text = answer.out.flush(final=False)
        if kept_tokens or text:
            yield Chunk(text, kept_tokens, kept_flags)

        # One step: draft (or not), verify in one target pass, accept.
        step_t0 = clock()
        committed = answer.committed
        draft = PLAIN
        if drafting is not None:
            draft = drafting.draft(committed, answer.remaining, answer.room, answer.context_room)
        result = verify(target, sampler, committed, draft.tokens, clock)
        if drafting is None:
            host_s = clock() - step_t0 - result.verify_s
        else:
            host_s = drafting.observe(committed, draft, result, step_t0)
        stats.record_pass(draft, result, host_s)
        step_tokens = result.tokens
        step_flags = [i < result.accepted for i in range(len(result.tokens))]
        if on_step is not None:
            on_step(committed + step_tokens)
