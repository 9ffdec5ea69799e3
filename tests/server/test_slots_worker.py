"""The worker with a real Engine (gemma-3-270m, CPU): each client's prefix serves that client alone, and
jobs submitted together run in one batch. Clients are named on the Job, as the routes name them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.stats import SpecStats
from app.server.runner.base import END, Job, Piece
from app.server.runner.worker import Worker
from tests.support.helpers import settings

BASE = "The quarterly report shows that revenue grew in every region, and the board asked for a summary of "


@pytest.fixture(scope="module")
def worker(gemma_path: Path) -> Iterator[Worker]:
    w = Worker(lambda stage: Engine(gemma_path, None, settings("ngram"), progress=stage), queue_size=16)
    w.start()
    assert w.loaded.wait(180)
    assert w.state == "ready", w.load_error
    yield w
    assert w.stop(30)


def _job(text: str, client: str, max_tokens: int = 4) -> Job:
    return Job(params=SamplingParams(), max_tokens=max_tokens, stop=[], text=text, client=client)


def _finish(job: Job) -> tuple[str, SpecStats]:
    text, stats = [], None
    while (item := job.results.get(timeout=300)) is not END:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Piece):
            text.append(item.text)
            stats = item.stats or stats
    assert stats is not None
    return "".join(text), stats


def _run(worker: Worker, text: str, client: str) -> SpecStats:
    job = _job(text, client)
    worker.submit(job)
    return _finish(job)[1]


def test_cached_tokens_stay_within_their_client(worker: Worker) -> None:
    window = _run(worker, BASE + "costs.", "window")
    key = _run(worker, BASE + "sales.", "key:5f1c")
    assert window.reused_tokens == 0
    assert key.reused_tokens == 0  # the window's overlapping prompt is not the key's to reuse
    window_again = _run(worker, BASE + "sales.", "window")
    key_again = _run(worker, BASE + "profits.", "key:5f1c")
    print(f"\ncached tokens: window {window.reused_tokens} then {window_again.reused_tokens}, "
          f"key {key.reused_tokens} then {key_again.reused_tokens}")  # fmt: skip
    assert window_again.reused_tokens > 10
    assert key_again.reused_tokens > 10
    assert worker.metrics.kv_tokens == worker.metrics.kv_cells


def test_jobs_submitted_together_share_decode_steps(worker: Worker) -> None:
    props = worker.props
    assert props is not None
    before = props["batching"]["batch_steps"]
    jobs = [_job(f"{i}, {i + 1}, {i + 2}, {i + 3},", f"client-{i}", max_tokens=16) for i in range(6)]
    for job in jobs:
        worker.submit(job)
    for job in jobs:
        text, stats = _finish(job)
        assert stats.emitted >= 1
        assert text
    props = worker.props
    assert props is not None
    assert props["batching"]["batch_steps"] > before
    assert worker.metrics.kv_tokens == worker.metrics.kv_cells
    assert worker.queue_depth == 0
