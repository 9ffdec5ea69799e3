"""Loading a pair: what a load that fails or is abandoned leaves behind, and the record it makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.backends.base import UNPLACED_N_CTX
from app.engine.backends.llama import LlamaBackend
from app.engine.engine import Engine
from app.engine.loading import load_pair, sized
from tests.support.helpers import settings


class Abandoned(Exception):
    pass


@pytest.mark.parametrize("stage", ["loading target", "loading drafter", "calibrating"])
def test_a_load_abandoned_at_any_stage_closes_every_model_it_loaded(
    gemma_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[LlamaBackend] = []
    closed: list[LlamaBackend] = []
    real_init, real_close = LlamaBackend.__init__, LlamaBackend.close

    def init(self: LlamaBackend, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(self)

    def close(self: LlamaBackend) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(LlamaBackend, "__init__", init)
    monkeypatch.setattr(LlamaBackend, "close", close)
    stages: list[str] = []

    def progress(name: str) -> None:
        stages.append(name)
        if name == stage:
            raise Abandoned(name)

    with pytest.raises(Abandoned):
        Engine(gemma_path, gemma_path, settings("model", n_ctx=512), progress)
    assert stages[-1] == stage
    assert len(opened) == {"loading target": 0, "loading drafter": 1, "calibrating": 2}[stage]
    assert all(model in closed for model in opened)


def test_the_loaded_pair_says_what_runs_and_why(gemma_path: Path) -> None:
    pair = load_pair(gemma_path, None, sized(settings("ngram", n_ctx=0)), lambda stage: None)
    try:
        assert pair.target.n_ctx == UNPLACED_N_CTX  # no placement sized it
        assert pair.backend_reason  # llama.cpp here, and why (no GPU, or not asked for)
        assert pair.drafter is not None
        assert pair.drafter.source == "ngram"
        assert pair.policy is not None
        assert pair.costs is not None
        assert (pair.draft_model, pair.vocab_verdict) == (None, None)
    finally:
        pair.close()
        pair.close()  # a second close does nothing more
