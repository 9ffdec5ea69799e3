"""`python -m app bench --backends`: backends side by side on one file; the margin where answers part."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli.backend_bench import _first_difference, _margin_at, bytes_per_token, compare


def test_bytes_per_token_counts_one_row_of_an_untied_embedding(gemma_path: Path, qwen_path: Path) -> None:
    # gemma-3-270m ties its output to the embedding, so the whole matrix is read (as the output head)
    gemma, qwen = bytes_per_token(gemma_path), bytes_per_token(qwen_path)
    assert 0.9 * gemma_path.stat().st_size < gemma <= gemma_path.stat().st_size
    assert qwen < 0.95 * qwen_path.stat().st_size  # Qwen's separate 151936-row embedding: one row of it


def test_first_difference() -> None:
    assert _first_difference([1, 2, 3], [1, 2, 3]) is None
    assert _first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert _first_difference([1, 2], [1, 2, 3]) == 2


def test_a_backend_profile_and_the_margin_of_its_own_choice(gemma_path: Path, capsys) -> None:
    (r,) = compare(gemma_path, ["llama"], 12, True, 4800.0, widths=(1, 4), repeats=3)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [p["backend"] for p in printed] == ["llama"]
    assert r["generated"] > 0
    assert r["tok_s"] > 0
    assert r["gb_s"] > 0
    assert sorted(r["verify_ms"]) == [1, 4]
    # the margin at a token its greedy answer chose: the top logit leads, so the gap is positive
    assert _margin_at("llama", gemma_path, r["answer"], 3) > 0
