"""The generation loop: prefill with KV reuse, speculative steps chosen by the policy, stopping, streaming."""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.engine.backends.base import Backend
from app.engine.drafters import Drafter, common_prefix
from app.engine.errors import ContextLengthExceeded, InvalidRequest
from app.engine.policy import DraftPolicy
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


@dataclass
class GenerationRequest:
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


class _Shadow:
    """Free drafters (lookups) are scored while the policy decodes plainly: no verify pass is spent.

    Each plain token is compared with the shadow draft's next position as it arrives, so the policy
    learns at once when drafts start to match again (a copied block of code, say).
    """

    def __init__(self) -> None:
        self.draft: list[int] = []
        self.pos = 0
        self.state = 0

    def start(self, draft: list[int], state: int) -> None:
        self.draft, self.pos, self.state = draft, 0, state

    def check(self, token: int, policy: DraftPolicy) -> None:
        if not self.draft:
            return
        hit = token == self.draft[self.pos]
        self.pos += 1
        last = self.pos == len(self.draft)
        policy.observe_position(self.pos - 1, hit, self.state, last)
        if not hit or last:
            self.draft = []


def generate(
    target: Backend,
    request: GenerationRequest,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[Chunk]:
    """Generate from request.prompt; the target's KV keeps the committed tokens for reuse by the next call."""
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
    media = request.media
    use_draft = bool(request.speculative and drafter is not None and policy is not None)
    image_mode = ""
    if media is not None:
        # A drafter model never saw the image; a lookup in the prompt and the reply still works.
        use_draft = use_draft and drafter is not None and drafter.source == "ngram"
        image_mode = "ngram" if use_draft else "plain"
    stats = SpecStats(
        draft_source=drafter.source if use_draft and drafter else "none", prompt_tokens=len(prompt)
    )
    if media is not None:
        stats.images, stats.image_tokens, stats.image_mode = media.images, media.image_tokens, image_mode
    sampler = Sampler(request.params, target.n_vocab)
    out = _TextOutput(request.stop)

    t0 = clock()
    reuse = min(common_prefix(target.kv_tokens, prompt), len(prompt) - 1)
    if media is not None:
        reuse = min(reuse, media.first_image)  # an image is evaluated anew, and so is all after it
    target.rollback(reuse)
    stats.reused_tokens = reuse
    if media is not None:
        media.prefill(target, reuse)  # up to the last prompt token, which the decode below takes
        reuse = len(prompt) - 1
    if request.params.plain_greedy:
        first = target.decode_argmax(prompt[reuse:], len(prompt) - reuse - 1)[0]
    else:
        rows = sampled_rows(target, sampler, prompt[reuse:], len(prompt) - reuse - 1)
        first = sampler.pick(rows[0], prompt)
    if use_draft:
        assert drafter is not None
        assert policy is not None
        drafter.begin(prompt, request.draft_prompt)
        policy.begin_request()
    stats.prefill_s = clock() - t0

    committed = prompt  # ends with the pending token once generation starts; KV holds committed[:-1]
    n_generated = 0
    shadow = _Shadow()
    free_drafter = use_draft and drafter is not None and drafter.cost_per_token_s == 0.0
    decode_t0 = clock()
    step_tokens, step_flags = [first], [False]
    finish: str | None = None

    while True:
        # Commit what the last step produced, stopping at end-of-generation, stop strings or limits.
        kept_tokens, kept_flags = [], []
        for token, flag in zip(step_tokens, step_flags, strict=True):
            if target.is_eog(token):
                finish = "stop"
                break
            committed.append(token)
            kept_tokens.append(token)
            kept_flags.append(flag)
            n_generated += 1
            out.add(target.token_bytes(token))
            if out.stopped:
                finish = "stop"
                break
            if n_generated >= request.max_tokens:
                finish = "length"
                break
            if len(committed) >= target.n_ctx:
                finish = "length"
                break
        stats.emitted = n_generated
        if finish is None and cancel is not None and cancel.is_set():
            finish = "cancelled"
        if finish is not None:
            # The pending token never entered the KV; drop drafts past the last committed token.
            target.rollback(min(len(target.kv_tokens), len(committed) - 1))
            if use_draft and drafter is not None:
                drafter.sync(committed)
            stats.decode_s = clock() - decode_t0
            yield Chunk(out.flush(final=True), kept_tokens, kept_flags, finish, stats)
            return
        text = out.flush(final=False)
        if kept_tokens or text:
            yield Chunk(text, kept_tokens, kept_flags)

        # One step: choose a draft length, draft, verify in one target pass, accept.
        step_t0 = clock()
        room = min(request.max_tokens - n_generated - 1, target.n_ctx - len(committed) - 1)
        k, draft, draft_s, proposal = 0, [], 0.0, []
        if use_draft:
            assert drafter is not None
            assert policy is not None
            if free_drafter:
                # A lookup costs nothing: look first, and choose knowing whether (and how far) it
                # found something. No match is a plain step, not a miss: only real drafts are judged.
                proposal = drafter.propose(committed, min(policy.max_draft, max(room, 0)))
                if media is not None and min(proposal, default=0) < 0:
                    proposal = proposal[: next(i for i, t in enumerate(proposal) if t < 0)]
                if drafter.match_len is not None:
                    policy.set_match(drafter.match_len)
                k = 0
                if proposal:
                    chosen = policy.choose(
                        remaining=request.max_tokens - n_generated, probe=False, available=len(proposal)
                    )
                    # Filler may run past max_tokens (those tokens are never kept) but never past
                    # the context.
                    k = min(chosen, max(target.n_ctx - len(committed) - 1, 0))
                draft = proposal[:k]
                if k == 0 and proposal and not shadow.draft:
                    shadow.start(proposal, policy.state)
            else:
                k = min(
                    policy.choose(
                        lambda: drafter.catch_up_tokens(committed) * drafter.prefill_cost_per_token_s,
                        request.max_tokens - n_generated,
                    ),
                    max(room, 0),
                )
                if k > 0:
                    d0 = clock()
                    draft = drafter.propose(committed, k)[:k]
                    draft_s = clock() - d0
                    policy.observe_draft_cost(len(draft), draft_s)
            if k == 0 and policy.last_reason:
                stats.fallback_steps += 1
                stats.fallback_reason = policy.last_reason
        n_real = len(draft)
        if use_draft and k > n_real and policy is not None and policy.pad_pays(n_real, k):
            # Keep the pass at the chosen width; filler is verified like any draft, and rarely kept.
            draft = draft + [draft[-1] if draft else committed[-1]] * (k - n_real)
        result = verify(target, sampler, committed, draft, clock)
        step_tokens = result.tokens
        step_flags = [i < result.accepted for i in range(len(result.tokens))]
        if use_draft:
            assert drafter is not None
            assert policy is not None
            if draft:
                if not free_drafter:  # only a drafter model caches what a step may reject
                    drafter.sync(committed + step_tokens)
            else:
                shadow.check(step_tokens[0], policy)
            if free_drafter:
                policy.observe_foreseen(
                    [i < len(proposal) and proposal[i] == t for i, t in enumerate(step_tokens)]
                )
            host_s = clock() - step_t0 - draft_s - result.verify_s
            # A draft that came out empty is a miss for the policy; a short one is judged on its tokens.
            policy.observe(
                n_real or k, min(result.accepted, n_real), result.verify_s, host_s, width=len(draft) + 1
            )
            stats.draft_s += draft_s
            stats.host_s += host_s
        else:
            stats.host_s += clock() - step_t0 - result.verify_s
        stats.verify_s += result.verify_s
        stats.record_step(k, len(draft), result.accepted, len(draft) - n_real, result.verify_s)
        if on_step is not None:
            on_step(committed + step_tokens)
