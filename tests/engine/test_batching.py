"""Continuous batching and KV slots on the real gemma-3-270m (CPU): streams decoded side by side give their
solo output (up to near-ties), every sequence's KV holds exactly its tokens after every step, a cancelled
stream leaves the others alone, prefixes stay with their client, and a seed gives one text whatever the
cache held."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.engine.engine import Engine
from app.engine.generation import Chunk, GenerationRequest
from app.engine.sampling import SamplingParams
from app.engine.stats import SpecStats
from tests.support.helpers import assert_exact, settings

# Prompts with repeats in them, so that n-gram lookups find drafts to verify in the batch.
PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The cat sat on the mat. The dog sat on the log. The bird sat on the",
    "Monday, Tuesday, Wednesday, Thursday,",
    "a b c d e f g h a b c d e f g h a b c",
    "Once upon a time, in a land far away, there lived a",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in",
    "red, green, blue, red, green, blue, red,",
]
MAX_TOKENS = 32


N_BATCH = 64  # small passes: prompts are fed in several, and batched prefill chunks share the budget


@pytest.fixture(scope="module")
def engine(gemma_path: Path) -> Iterator[Engine]:
    # adaptive off: a lookup's draft is verified whenever it finds one, so drafts ride in every batch
    base = settings("ngram", max_draft=4, adaptive=False)
    engine_settings = base.engine.model_copy(update={"n_batch": N_BATCH})
    with Engine(gemma_path, None, base.model_copy(update={"engine": engine_settings})) as e:
        yield e


def _request(engine: Engine, text: str, max_tokens: int = MAX_TOKENS, **params: object) -> GenerationRequest:
    return GenerationRequest(
        prompt=engine.tokenize_text(text), max_tokens=max_tokens, params=SamplingParams(**params)
    )


def _solo(engine: Engine, request: GenerationRequest, client: str = "solo") -> tuple[list[int], SpecStats]:
    tokens: list[int] = []
    stats = SpecStats()
    for chunk in engine.generate(request, client=client):
        tokens += chunk.tokens
        stats = chunk.stats or stats
    return tokens, stats


def _check_kv(engine: Engine) -> None:
    """Every slot's cells are exactly the tokens it keeps; an open stream's slot keeps its committed tokens
    (all but the pending one), or the prompt chunks fed so far."""
    target = engine.target
    for slot in engine.slots.slots:
        kept = target.seq_tokens(slot.seq)
        assert target.seq_cells(slot.seq) == ((0, len(kept) - 1) if kept else (-1, -1))
    for entry in engine.scheduler.entries:
        kept = target.seq_tokens(entry.slot.seq)
        if entry.stream.started:
            assert kept == entry.stream.committed[:-1]
        elif entry.fed >= 0:
            assert kept == entry.stream.prompt[: entry.fed]
    tokens, cells = engine.slots.figures()
    assert tokens == cells


class _Batch:
    """Streams opened on the engine and stepped together, the KV checked after every step."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tokens: dict[int, list[int]] = {}
        self.finish: dict[int, str | None] = {}
        self.stats: dict[int, SpecStats] = {}
        self.cancels: dict[int, threading.Event] = {}

    def open(self, tag: int, request: GenerationRequest) -> None:
        self.cancels[tag] = threading.Event()
        assert self.engine.open_stream(request, self.cancels[tag], f"client-{tag}", tag) is not None
        self.tokens[tag] = []

    def step(self) -> None:
        for tag, outcome in self.engine.step_streams():
            assert isinstance(outcome, Chunk), outcome
            self.tokens[tag] += outcome.tokens
            if outcome.finish_reason is not None:
                self.finish[tag] = outcome.finish_reason
                assert outcome.stats is not None
                self.stats[tag] = outcome.stats
        _check_kv(self.engine)

    def run(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.engine.scheduler.entries:
                return
            self.step()
        raise AssertionError("the batch did not finish")


def test_eight_streams_in_one_batch_give_their_solo_output(engine: Engine) -> None:
    requests = [_request(engine, text) for text in PROMPTS]
    solo = [_solo(engine, r)[0] for r in requests]
    batch = _Batch(engine)
    steps_before = engine.scheduler.batch_steps
    for tag in range(4):
        batch.open(tag, requests[tag])
    for _ in range(3):  # the first four decode while the other four's prompts are read in between
        batch.step()
    for tag in range(4, 8):
        batch.open(tag, requests[tag])
    batch.run()
    for tag, request in enumerate(requests):
        assert batch.finish[tag] in ("length", "stop")
        assert_exact(engine, list(request.prompt), solo[tag], batch.tokens[tag])
    drafted = sum(batch.stats[tag].drafted for tag in range(8))
    accepted = sum(batch.stats[tag].accepted for tag in range(8))
    batched = engine.scheduler.batch_steps - steps_before
    print(
        f"\n8 streams: {batched} batched steps; {drafted} n-gram draft tokens verified, {accepted} accepted"
    )
    assert batched > 0
    assert sum(batch.stats[tag].drafted for tag in range(1, 8)) > 0  # drafts verified within the batch
    assert all(batch.stats[tag].shared_passes > 0 for tag in range(8))
    assert engine.props()["batching"]["batched"] is True


def test_cancelling_one_stream_leaves_the_others_unchanged(engine: Engine) -> None:
    requests = [_request(engine, text, 24) for text in PROMPTS[:4]]
    solo = [_solo(engine, r)[0] for r in requests]
    batch = _Batch(engine)
    for tag, request in enumerate(requests):
        batch.open(tag, request)
    for _ in range(4):
        batch.step()
    batch.cancels[1].set()
    batch.run()
    assert batch.finish[1] == "cancelled"
    assert len(batch.tokens[1]) < len(solo[1])
    assert_exact(engine, list(requests[1].prompt), solo[1][: len(batch.tokens[1])], batch.tokens[1])
    for tag in (0, 2, 3):
        assert_exact(engine, list(requests[tag].prompt), solo[tag], batch.tokens[tag])


def test_a_stream_cancelled_before_its_prefill_reads_nothing(engine: Engine) -> None:
    batch = _Batch(engine)
    batch.open(0, _request(engine, PROMPTS[0], 16))
    batch.step()  # the first stream is prefilled alone and decodes
    batch.open(1, _request(engine, PROMPTS[5], 16))
    batch.cancels[1].set()
    batch.run()
    assert batch.finish[1] == "cancelled"
    assert batch.tokens[1] == []
    assert batch.stats[1].emitted == 0


def test_a_clients_prefix_serves_that_client_only(engine: Engine) -> None:
    base = "The quarterly report shows that revenue grew in every region, and the board asked for "
    first = _request(engine, base + "a summary.", 4)
    follow = _request(engine, base + "a longer summary of costs.", 4)
    _, cold = _solo(engine, first, client="window")
    assert cold.reused_tokens == 0
    _, other = _solo(engine, follow, client="key:other")
    assert other.reused_tokens == 0  # another client's overlapping prompt reuses nothing
    _, own = _solo(engine, follow, client="window")
    assert own.reused_tokens > len(engine.tokenize_text(base)) // 2
    tokens, cells = engine.slots.figures()
    assert tokens == cells


SEED_TEXT = (
    "The orchard at the end of the valley grows fruit that no market has ever sold: its keeper crosses "
    "old varieties every spring, writes their names in a green notebook, and tastes each one before "
    "the first frost. Some are sweet as honey, some are sour as lemons, and a few taste of nothing at all "
    "until they are cooked. This year the notebook holds a new page. Write the name of the new fruit, then "
    "describe its taste:"
)


def test_a_seed_gives_the_same_text_cold_and_cached(engine: Engine) -> None:
    seeded = replace(_request(engine, SEED_TEXT, 24, temperature=1.0, seed=7), reproducible=True)
    n_prompt = len(seeded.prompt)
    assert n_prompt > N_BATCH + 8

    def crowd() -> None:  # other clients' prefixes fill other slots (and cells) of the cache
        for i, text in enumerate(PROMPTS[:3]):
            _solo(engine, _request(engine, text * 3, 8), client=f"crowd-{i}")

    crowd()
    cold, cold_stats = _solo(engine, seeded, client="seed")
    crowd()
    cached, cached_stats = _solo(engine, seeded, client="seed")
    # another prompt with the same start: only their shared beginning stays cached
    _solo(engine, _request(engine, SEED_TEXT.replace("its taste", "its colour"), 4), client="seed")
    crowd()
    partial, partial_stats = _solo(engine, seeded, client="seed")
    reused = [cold_stats.reused_tokens, cached_stats.reused_tokens, partial_stats.reused_tokens]
    first = engine.target.token_bytes(cold[0])
    print(f"\nseed 7 at T=1, {n_prompt} prompt tokens, {reused} reused: {first!r}...")
    assert reused[0] == 0
    assert reused[1] == reused[2] == N_BATCH  # the prefix fed in whole passes, as a cold prefill feeds it
    assert cold_stats.fallback_reason.startswith("a seeded sampled request decodes plainly")
    assert cached == cold
    assert partial == cold
    # an unseeded request keeps reusing the whole shared prefix
    _, unseeded = _solo(engine, _request(engine, SEED_TEXT, 2), client="seed")
    assert unseeded.reused_tokens == n_prompt - 1


@pytest.mark.parametrize(
    ("slots", "n_batch", "max_draft", "expected", "alone_because"),
    [
        (1, 64, 4, 1, "engine.slots is 1"),
        (3, 64, 4, 3, None),
        (8, 32, 4, 6, None),
        (8, 32, 16, 1, "engine.n_batch 32 holds one stream's verify pass of 17 tokens"),
    ],
)
def test_the_slots_setting_sizes_the_cache(
    gemma_path: Path, slots: int, n_batch: int, max_draft: int, expected: int, alone_because: str | None
) -> None:
    """[engine] slots sets the KV slots, as many as one verify pass of every stream's draft fits in
    n_batch (max_draft 4: 5 tokens a stream, so 32 // 5 = 6 of 8; max_draft 16: 32 // 17 = 1)."""
    base = settings("ngram", max_draft=max_draft)
    engine_settings = base.engine.model_copy(update={"n_batch": n_batch, "slots": slots})
    with Engine(gemma_path, None, base.model_copy(update={"engine": engine_settings})) as e:
        assert len(e.slots.slots) == expected
        batching = e.props()["batching"]
        assert batching["slots"] == expected
        assert batching["batched"] is (expected > 1)
        if alone_because is not None:
            assert batching["reason"] == f"{alone_because}: requests run one at a time"
