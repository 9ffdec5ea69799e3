"""Pairing verdicts on the real test models, and on a copy whose token list was altered at one id."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.catalog import gguf, pairing

ALTERED_ID = 1234


@pytest.fixture(scope="module")
def gemma_header(gemma_path: Path) -> gguf.GGUFHeader:
    return gguf.read_file(gemma_path)


@pytest.fixture(scope="module")
def qwen_header(qwen_path: Path) -> gguf.GGUFHeader:
    return gguf.read_file(qwen_path)


@pytest.fixture(scope="module")
def altered_gemma(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte copy of gemma-3-270m whose token ALTERED_ID is upper-cased in place with the gguf package."""
    from gguf import GGUFReader

    path = tmp_path_factory.mktemp("altered") / "gemma-altered.gguf"
    shutil.copyfile(gemma_path, path)
    reader = GGUFReader(path, "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    text = field.parts[field.data[ALTERED_ID]]
    original = bytes(text)
    assert original.upper() != original, "pick a token with lower-case letters"
    text[:] = np.frombuffer(original.upper(), dtype=np.uint8)
    del reader, field, text  # closes the writable memory map
    return path


def test_gemma_drafting_for_qwen_is_refused_for_tokens_and_offered_across_vocabularies(
    qwen_header: gguf.GGUFHeader, gemma_header: gguf.GGUFHeader
) -> None:
    verdict = pairing.check_pair(qwen_header, gemma_header)
    assert not verdict.compatible
    assert verdict.usable
    assert verdict.mode == "cross-vocab"
    failed = {r.name for r in verdict.rules if not r.passed}
    assert failed == {"vocab type", "BOS/EOS", "vocab size", "token text", "chat template tokens"}
    assert verdict.first_mismatch_id == pairing.VOCAB_CHECK_START_ID
    summary = verdict.summary()
    assert "incompatible for token-level drafting" in summary
    assert "151,936" in summary
    assert "262,144" in summary
    assert "cross-vocabulary drafting" in summary
    assert "<|im_start|>" in summary  # the template's special tokens are named


@pytest.mark.parametrize("which", ["gemma", "qwen"])
def test_each_model_is_compatible_with_itself(
    which: str, gemma_header: gguf.GGUFHeader, qwen_header: gguf.GGUFHeader
) -> None:
    header = gemma_header if which == "gemma" else qwen_header
    verdict = pairing.check_pair(header, header)
    assert verdict.compatible, verdict.summary()
    assert all(r.passed for r in verdict.rules)
    assert verdict.first_mismatch_id is None
    assert verdict.mode == "token"


def test_one_altered_token_makes_the_pair_incompatible_naming_the_id(
    gemma_header: gguf.GGUFHeader, altered_gemma: Path
) -> None:
    altered = gguf.read_file(altered_gemma)
    verdict = pairing.check_pair(gemma_header, altered)
    assert not verdict.compatible
    assert verdict.first_mismatch_id == ALTERED_ID
    failed = [r for r in verdict.rules if not r.passed]
    assert [r.name for r in failed] == ["token text"]
    assert f"token {ALTERED_ID} differs" in failed[0].detail


def test_models_pair_command_prints_the_verdict_as_json(gemma_path: Path, altered_gemma: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "app", "models", "pair", str(gemma_path), str(altered_gemma), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    verdict = json.loads(out.stdout)
    assert verdict["compatible"] is False
    assert verdict["first_mismatch_id"] == ALTERED_ID
    assert verdict["mode"] == "cross-vocab"


def test_a_drafter_that_is_not_a_text_model_is_refused(gemma_header: gguf.GGUFHeader) -> None:
    clip = gguf.GGUFHeader(3, {"general.architecture": "clip"}, [], 0)
    verdict = pairing.check_pair(gemma_header, clip)
    assert not verdict.usable
    assert verdict.mode == "refused"
    assert "not a text generator" in verdict.summary()
