"""Which draft source a loaded pair's generations use, why, and what drafting gained over them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.engine.drafting.drafters import Drafter
from app.engine.drafting.policy import DraftPolicy, TrialState
from app.engine.drafting.step import Speculation
from app.engine.generation import Chunk
from app.engine.stats import DraftGains

# After a drafter model's trial failed, generations draft by lookup; a new trial comes after this many
# of them, then after twice as many, and so on: acceptance differs from task to task.
RETRIAL_AFTER = 4


class DraftChoice:
    """The drafter and its policy, or where a drafter model's trial failed, the lookup (when there is one)."""

    def __init__(self, lookup: Speculation | None = None) -> None:
        self.lookup = lookup
        self._retrial_after = RETRIAL_AFTER
        self._since_failure = 0
        self.gained = DraftGains()

    def speculation(self, drafter: Drafter | None, policy: DraftPolicy | None) -> Speculation | None:
        """What the next generation drafts with (None: plain decoding only)."""
        if drafter is None or policy is None:
            return None
        if self.lookup is not None and policy.trial.state is TrialState.FAILED:
            return self.lookup
        return Speculation(drafter, policy)

    def next_generation(self, policy: DraftPolicy | None) -> None:
        """A generation that may draft starts: a failed drafter model gets a new trial now and then."""
        if policy is None or self.lookup is None or policy.trial.state is not TrialState.FAILED:
            return
        self._since_failure += 1
        if self._since_failure > self._retrial_after:
            self._since_failure = 0
            self._retrial_after *= 2
            policy.retry_trial()

    def tallied(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """The chunks of a generation, its final stats counted in what drafting gained."""
        for chunk in chunks:
            if chunk.stats is not None and chunk.stats.draft_source != "none":
                self.gained.add(chunk.stats)
            yield chunk

    def describe(self, drafter: Drafter | None, policy: DraftPolicy | None) -> dict[str, Any]:
        """Which drafter the next generation uses, why, and what drafting gained so far."""
        speculation = self.speculation(drafter, policy)
        out: dict[str, Any] = {"drafter": speculation.drafter.source if speculation else "none"}
        if drafter is None or policy is None:
            out["reason"] = "plain decoding: the settings ask for no drafter"
        elif drafter.source == "ngram":
            out["reason"] = "n-gram prompt lookup, as the settings ask (no drafter model given)"
        elif not policy.adaptive:
            out["reason"] = "the drafter model at a fixed draft length (draft.adaptive is off)"
        else:
            trial = policy.trial
            out["trial"] = trial.as_dict()
            if trial.state is TrialState.RUNNING:
                out["reason"] = (
                    f"the drafter model on trial: {trial.drafted_steps} of {trial.steps} drafted steps made"
                )
            elif trial.state is TrialState.PAID or self.lookup is None:
                out["reason"] = f"the drafter model: its {trial.verdict}"
            else:
                out["reason"] = (
                    f"n-gram prompt lookup: the drafter model's {trial.verdict}; it is tried again after "
                    f"{self._retrial_after - self._since_failure} more generations"
                )
        out["gained"] = self.gained.as_dict()
        return out
