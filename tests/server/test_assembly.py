"""A packaged model's first assembly is reported as it goes: a load stage, then INFO lines with the share
written (the real gemma-3-270m parts assembled into this session's cache, then loaded)."""

from __future__ import annotations

import logging
import pickle
import re

import pytest

from app.catalog.packaged import GEMMA_270M
from app.config import EngineSettings, Settings
from app.server import assembly
from app.server.runner.load import LoadRequest


def test_assembling_a_packaged_model_reports_its_progress(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        GEMMA_270M.part_paths()
    except Exception as exc:
        pytest.skip(str(exc))
    GEMMA_270M.cache_path().unlink(missing_ok=True)  # this session's cache: assembled afresh
    monkeypatch.setattr(assembly, "POLL_S", 0.02)  # the copy takes about a second here
    settings = Settings(engine=EngineSettings(n_ctx=512, n_threads=1, device="cpu"))
    loader = LoadRequest.of(settings, GEMMA_270M.key, None, "none")
    stages: list[str] = []
    with caplog.at_level(logging.INFO, logger="foresight.assembly"):
        engine = loader(stages.append)
    try:
        assert engine.props()["target"]["path"] == str(GEMMA_270M.cache_path())
    finally:
        engine.close()
    assert stages[0] == assembly.STAGE
    assert "loading target" in stages
    line = re.compile(rf"assembling {re.escape(GEMMA_270M.file_name)}: (\d+)% of \d+ MiB")
    shares = [int(m[1]) for r in caplog.records if (m := line.match(r.getMessage()))]
    assert shares, "no progress line"
    assert shares == sorted(shares)
    assert all(0 <= s <= 99 for s in shares)
    assert not assembly.partial_file(GEMMA_270M).exists()


def test_a_model_given_as_a_file_is_not_assembled() -> None:
    stages: list[str] = []
    assembly.assemble_packaged(["/some/file.gguf", None], stages.append)
    assert stages == []


def test_a_load_request_is_data_that_crosses_to_a_child_process() -> None:
    """The engine child gets the pair and the settings to load, not code: a plain pickle carries it."""
    settings = Settings(engine=EngineSettings(n_ctx=512, mmproj="/models/projector.gguf"))
    request = LoadRequest.of(settings, "/models/target.gguf", "/models/draft.gguf", "model", None)
    again = pickle.loads(pickle.dumps(request))
    assert again == request
    assert (again.target, again.draft) == ("/models/target.gguf", "/models/draft.gguf")
    assert again.settings.draft.mode == "model"
    assert again.settings.engine.mmproj is None  # the request's own projector (none) wins over the settings'
    assert again.settings.engine.n_ctx == 512
