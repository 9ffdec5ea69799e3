"""Speculation statistics of one generation: what was drafted, what the target accepted, where time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.engine.drafting.step import Draft
    from app.engine.speculative import StepResult


@dataclass
class SpecStats:
    draft_source: str = "none"  # none | ngram | model | cross-vocab
    steps: int = 0  # target passes during generation (plain and verify)
    spec_steps: int = 0  # passes that verified a draft
    drafted: int = 0  # draft tokens verified, filler included
    padded: int = 0  # filler tokens that kept a pass at the chosen width (a GPU graph's shape)
    accepted: int = 0
    emitted: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous request
    draft_position_tries: list[int] = field(default_factory=list)
    draft_position_hits: list[int] = field(default_factory=list)
    draft_lengths: dict[int, int] = field(default_factory=dict)  # chosen max draft length -> steps
    accepted_hist: dict[int, int] = field(default_factory=dict)  # accepted drafts per spec step -> count
    # per target pass: (width, real draft tokens, accepted, verify ms), for reading a policy's choices
    passes: list[tuple[int, int, int, float]] = field(default_factory=list)
    shared_passes: int = 0  # target passes shared with other streams (continuous batching)
    fallback_steps: int = 0  # steps the policy decoded plainly because drafting would not pay
    fallback_reason: str = ""
    images: int = 0  # images in the prompt
    image_tokens: int = 0  # prompt positions the images fill (libmtmd's count), within prompt_tokens
    image_mode: str = ""  # with images: ngram | plain (a drafter model cannot see them)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    host_s: float = 0.0
    decode_s: float = 0.0  # wall time from the first generated token to the last

    def record_pass(self, draft: Draft, result: StepResult, host_s: float) -> None:
        """One target pass of the generation: the draft it verified, what it kept, where the time went."""
        if draft.fallback_reason:
            self.fallback_steps += 1
            self.fallback_reason = draft.fallback_reason
        self.draft_s += draft.seconds
        self.host_s += host_s
        self.verify_s += result.verify_s
        self.record_step(draft.chosen, len(draft.tokens), result.accepted, draft.padded, result.verify_s)

    def record_step(
        self, max_len: int, drafted: int, accepted: int, padded: int = 0, verify_s: float = 0.0
    ) -> None:
        self.steps += 1
        self.passes.append((drafted + 1, drafted - padded, accepted, round(verify_s * 1e3, 3)))
        self.padded += padded
        self.draft_lengths[max_len] = self.draft_lengths.get(max_len, 0) + 1
        if drafted == 0:
            return
        self.spec_steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.accepted_hist[accepted] = self.accepted_hist.get(accepted, 0) + 1
        while len(self.draft_position_tries) < drafted:
            self.draft_position_tries.append(0)
            self.draft_position_hits.append(0)
        for i in range(min(drafted, accepted + 1)):
            self.draft_position_tries[i] += 1
            if i < accepted:
                self.draft_position_hits[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens emitted per target pass: accepted drafts plus the target's own token."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.emitted / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "draft_source": self.draft_source,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "padded": self.padded,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_len": round(self.mean_accepted_len, 3),
            "acceptance_by_position": [
                round(h / t, 4) if t else 0.0
                for h, t in zip(self.draft_position_hits, self.draft_position_tries, strict=True)
            ],
            "accepted_histogram": {str(k): v for k, v in sorted(self.accepted_hist.items())},
            "draft_lengths": {str(k): v for k, v in sorted(self.draft_lengths.items())},
            "target_passes": self.steps,
            "shared_passes": self.shared_passes,
            "fallback_steps": self.fallback_steps,
            "fallback_reason": self.fallback_reason,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "images": self.images,
            "image_tokens": self.image_tokens,
            "image_mode": self.image_mode,
            "emitted": self.emitted,
            "time_s": {
                "prefill": round(self.prefill_s, 4),
                "draft": round(self.draft_s, 4),
                "verify": round(self.verify_s, 4),
                "host": round(self.host_s, 4),
                "decode": round(self.decode_s, 4),
            },
            "tokens_per_second": round(self.tokens_per_second, 2),
        }


class DraftGains:
    """What drafting gained over the generations that drafted: tokens per target pass, acceptance."""

    def __init__(self) -> None:
        self.generations = 0
        self.emitted = self.passes = self.drafted = self.accepted = 0

    def add(self, stats: SpecStats) -> None:
        self.generations += 1
        self.emitted += stats.emitted
        self.passes += stats.steps
        self.drafted += stats.drafted
        self.accepted += stats.accepted

    def as_dict(self) -> dict[str, Any]:
        return {
            "generations": self.generations,
            "tokens_per_pass": round(self.emitted / self.passes, 3) if self.passes else 0.0,
            "acceptance_rate": round(self.accepted / self.drafted, 3) if self.drafted else 0.0,
        }
