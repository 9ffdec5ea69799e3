"""Servers shared by the API test modules: one gemma-3-270m and one Qwen2.5-Coder-1.5B `serve` process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server_helpers import EngineServer, engine_server


@pytest.fixture(scope="session")
def gemma_api(gemma_path: Path) -> Iterator[EngineServer]:
    """The small model with n-gram drafting: fast answers for the request-field and shape tests."""
    with engine_server(["--target", str(gemma_path), "--ngram", "--n-ctx", "2048", "--n-threads", "2"]) as s:
        yield s


@pytest.fixture(scope="session")
def qwen_api(qwen_path: Path) -> Iterator[EngineServer]:
    """The default model (its template renders tools) with n-gram drafting."""
    args = ["--target", str(qwen_path), "--ngram", "--n-ctx", "4096", "--n-threads", "2"]
    with engine_server(args) as s:
        yield s
