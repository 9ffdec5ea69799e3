"""Shared fixtures: isolated app dirs, the packaged test models, and engines loaded once per session."""

from __future__ import annotations

# llama_cpp before NumPy: with a CUDA build the other order was seen to segfault. The kernel tests also
# run where llama-cpp-python is not built (the GPU machine before its build).
import importlib.util  # isort: skip

if importlib.util.find_spec("llama_cpp") is not None:
    import llama_cpp  # noqa: F401  # isort: skip

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # GUI tests run without a display

from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest

# Test models are assembled once per machine, outside the per-session app dirs.
MODEL_CACHE = Path(
    os.environ.get(
        "FORESIGHT_TEST_MODELS", Path(platformdirs.user_cache_dir("Foresight")) / "packaged-models"
    )
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The coding clients' suite (about 11 minutes on 2 cores) runs when asked for: `-m clients`, or
    FORESIGHT_CLIENTS_REQUIRED=1 as CI sets after installing them (.ci/run's own step)."""
    asked = "clients" in (config.option.markexpr or "") or os.environ.get("FORESIGHT_CLIENTS_REQUIRED") == "1"
    if asked:
        return
    skip = pytest.mark.skip(reason="the coding clients' suite runs with -m clients (.ci/run's own step)")
    for item in items:
        if item.get_closest_marker("clients") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("foresight-home")
    old = os.environ.get("FORESIGHT_HOME")
    os.environ["FORESIGHT_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("FORESIGHT_HOME", None)
    else:
        os.environ["FORESIGHT_HOME"] = old


def _packaged(key: str, env: str) -> Path:
    """A packaged test model, or the file named by `env` (machines without the packages, e.g. the GPU box)."""
    from app.catalog.packaged import PACKAGED, ModelPackageMissing

    if os.environ.get(env):
        return Path(os.environ[env])
    try:
        return PACKAGED[key].path(MODEL_CACHE)
    except ModelPackageMissing as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs the test models: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return _packaged("gemma-3-270m", "FORESIGHT_TEST_GEMMA")


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    return _packaged("qwen2.5-coder-1.5b-instruct", "FORESIGHT_TEST_QWEN")


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    return _packaged("qwen2.5-coder-0.5b-instruct", "FORESIGHT_TEST_QWEN_DRAFT")
