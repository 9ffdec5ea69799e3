"""The command line as a user runs it: real subprocesses, real models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
        check=False,
    )


def test_help_lists_the_commands() -> None:
    out = _run("--help")
    assert out.returncode == 0
    for command in ("chat", "generate", "bench"):
        assert command in out.stdout


def test_generate_prints_text_and_speculation_stats(gemma_path: Path) -> None:
    out = _run("generate", "--target", str(gemma_path), "--ngram", "--raw", "--temperature", "0",
               "--max-tokens", "12", "--json", "The capital of France is")  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["finish_reason"] in ("length", "stop")
    assert result["text"]
    stats = result["stats"]
    assert stats["draft_source"] == "ngram"
    assert stats["emitted"] <= 12
    assert set(stats["time_s"]) == {"prefill", "draft", "verify", "host", "decode"}


def test_bench_reports_every_prompt_side_by_side(gemma_path: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([
        {"name": "copy", "kind": "verbatim", "prompt": "Repeat: one two three four five. one two three"},
        {"name": "chat", "kind": "chat", "messages": [{"role": "user", "content": "Name a colour."}]},
    ]))  # fmt: skip
    out = _run("bench", "--target", str(gemma_path), "--draft", str(gemma_path), "--prompts", str(prompts),
               "--tokens", "16", "--max-draft", "4", "--json", "--repeat", "3")  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    rows, summary = lines[:-1], lines[-1]
    assert [r["prompt"] for r in rows] == ["copy", "chat"]
    for r in rows:
        assert r["plain_tok_s"] > 0
        assert r["spec_tok_s"] > 0
        assert r["ratio"] == pytest.approx(r["spec_tok_s"] / r["plain_tok_s"], rel=0.01)
        assert r["match"] or r["near_tie"]
        # three runs a side, alternating; the reported one is each side's median
        assert len(r["plain_tok_s_runs"]) == len(r["spec_tok_s_runs"]) == 3
        assert r["plain_tok_s"] == sorted(r["plain_tok_s_runs"])[1]
        assert r["spec_tok_s"] == sorted(r["spec_tok_s_runs"])[1]
    assert summary["props"]["draft"]["vocabulary"]["compatible"] is True
    assert len(summary["props"]["draft"]["policy"]["verify_cost_ms"]) == 5


def test_a_bad_model_path_is_a_clear_error(tmp_path: Path) -> None:
    out = _run("generate", "--target", str(tmp_path / "missing.gguf"), "hello")
    assert out.returncode == 2
    assert "no such model file" in out.stderr


def test_engine_entry_is_the_serve_command() -> None:
    # The frozen executable starts its engine process as `Foresight --engine ...`.
    out = _run("--engine", "--help")
    assert out.returncode == 0
    assert "usage:" in out.stdout
    assert "serve" in out.stdout
    assert "--port" in out.stdout
