"""A generation's drafting: the drafter and its policy choose each step's draft, make it and learn from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from app.engine.drafting.drafters import Drafter
from app.engine.drafting.estimates import DraftState
from app.engine.drafting.policy import DraftPolicy
from app.engine.speculative import StepResult


@dataclass(frozen=True)
class Speculation:
    """What a generation drafts with: a draft source and the policy that chooses its draft lengths."""

    drafter: Drafter
    policy: DraftPolicy

    @property
    def free(self) -> bool:
        """A lookup: drafting costs nothing, so its draft is made before the choice."""
        return self.drafter.cost_per_token_s == 0.0


@dataclass(frozen=True)
class Draft:
    """One step's draft as the target verifies it: real draft tokens, then any filler."""

    tokens: list[int] = field(default_factory=list)
    chosen: int = 0  # the draft length the policy chose (0: a plain step)
    real: int = 0  # tokens of `tokens` the drafter proposed; the rest is filler
    seconds: float = 0.0  # drafting time
    proposal: list[int] = field(default_factory=list)  # a lookup's whole proposal, made or not drafted
    fallback_reason: str = ""  # why the policy decoded plainly

    @property
    def padded(self) -> int:
        return len(self.tokens) - self.real


PLAIN = Draft()


class _Shadow:
    """Free drafters (lookups) are scored while the policy decodes plainly: no verify pass is spent.

    Each plain token is compared with the shadow draft's next position as it arrives, so the policy
    learns at once when drafts start to match again (a copied block of code, say).
    """

    def __init__(self) -> None:
        self.draft: list[int] = []
        self.pos = 0
        self.state: DraftState | None = None

    def start(self, draft: list[int], state: DraftState) -> None:
        self.draft, self.pos, self.state = draft, 0, state

    def check(self, token: int, policy: DraftPolicy) -> None:
        if not self.draft or self.state is None:
            return
        hit = token == self.draft[self.pos]
        self.pos += 1
        last = self.pos == len(self.draft)
        policy.observe_position(self.pos - 1, hit, self.state, last)
        if not hit or last:
            self.draft = []


class Drafting:
    """One generation's drafting with a Speculation: begin, then per step `draft` and `observe`, then `end`.

    images: the prompt holds images, which a drafter model never saw (a lookup drafts over the text, and
    skips the image positions).
    """

    def __init__(self, speculation: Speculation, clock: Callable[[], float], images: bool = False) -> None:
        self.drafter = speculation.drafter
        self.policy = speculation.policy
        self.free = speculation.free
        self._clock = clock
        self._images = images
        self._shadow = _Shadow()
        self._reads_prompt = True  # a drafter model's first draft reads the prompt first

    @property
    def source(self) -> str:
        return self.drafter.source

    def begin(self, prompt: list[int], draft_prompt: bytes | None) -> None:
        self.drafter.begin(prompt, draft_prompt)
        self.policy.begin_request()

    def draft(self, committed: list[int], remaining: int, room: int, context_room: int) -> Draft:
        """The next step's draft. remaining: tokens the request may still generate; room: draft tokens
        that can still be kept (within max_tokens and the context); context_room: tokens the context
        still takes after the pending one (filler may run past max_tokens, never past the context)."""
        if self.free:
            draft = self._lookup(committed, remaining, room, context_room)
        else:
            draft = self._model(committed, remaining, room)
        if draft.chosen > draft.real and self.policy.pad_pays(draft.real, draft.chosen):
            # Keep the pass at the chosen width; filler is verified like any draft, and rarely kept.
            filler = [draft.tokens[-1] if draft.tokens else committed[-1]] * (draft.chosen - draft.real)
            draft = replace(draft, tokens=draft.tokens + filler)
        return draft

    def _reason(self, k: int) -> str:
        return self.policy.last_reason if k == 0 else ""

    def _lookup(self, committed: list[int], remaining: int, room: int, context_room: int) -> Draft:
        # A lookup costs nothing: look first, and choose knowing whether (and how far) it found
        # something. No match is a plain step, not a miss: only real drafts are judged.
        policy = self.policy
        proposal = self.drafter.propose(committed, min(policy.max_draft, max(room, 0)))
        if self._images and min(proposal, default=0) < 0:
            proposal = proposal[: next(i for i, t in enumerate(proposal) if t < 0)]
        if self.drafter.match_len is not None:
            policy.set_match(self.drafter.match_len)
        k = 0
        if proposal:
            chosen = policy.choose(remaining=remaining, probe=False, available=len(proposal))
            k = min(chosen, max(context_room, 0))
        draft = proposal[:k]
        if k == 0 and proposal and not self._shadow.draft:
            self._shadow.start(proposal, policy.state)
        return Draft(draft, k, len(draft), 0.0, proposal, self._reason(k))

    def _model(self, committed: list[int], remaining: int, room: int) -> Draft:
        drafter, policy = self.drafter, self.policy
        k = min(
            policy.choose(
                lambda: drafter.catch_up_tokens(committed) * drafter.prefill_cost_per_token_s, remaining
            ),
            max(room, 0),
        )
        if k == 0:
            return Draft(fallback_reason=self._reason(k))
        t0 = self._clock()
        draft = drafter.propose(committed, k)[:k]
        seconds = self._clock() - t0
        policy.observe_draft_cost(len(draft), seconds, per_token=not self._reads_prompt)
        self._reads_prompt = False
        return Draft(draft, k, len(draft), seconds)

    def observe(self, committed: list[int], draft: Draft, result: StepResult, step_t0: float) -> float:
        """What the step gave, told to the drafter and the policy; returns the step's host seconds."""
        if draft.tokens:
            if not self.free:  # only a drafter model caches what a step may reject
                self.drafter.sync(committed + result.tokens)
        else:
            self._shadow.check(result.tokens[0], self.policy)
        if self.free:
            proposal = draft.proposal
            self.policy.observe_foreseen(
                [i < len(proposal) and proposal[i] == t for i, t in enumerate(result.tokens)]
            )
        host_s = self._clock() - step_t0 - draft.seconds - result.verify_s
        # A draft that came out empty is a miss for the policy; a short one is judged on its tokens.
        self.policy.observe(
            draft.real or draft.chosen,
            min(result.accepted, draft.real),
            result.verify_s,
            host_s,
            width=len(draft.tokens) + 1,
        )
        return host_s

    def end(self, committed: list[int]) -> None:
        self.drafter.sync(committed)
