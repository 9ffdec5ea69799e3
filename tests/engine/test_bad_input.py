"""Bad input gets a clear exception and message; the process keeps running and the models keep working."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from app.catalog import gguf
from app.config import ConfigError, DraftSettings, EngineSettings, Settings
from app.engine.backends.llama import LlamaBackend
from app.engine.engine import Engine
from app.engine.errors import ContextLengthExceeded, DrafterUnusable, InvalidRequest, ModelLoadError
from app.engine.generation import GenerationRequest
from tests.support.helpers import settings


def _gguf_bytes(metadata: dict[str, str]) -> bytes:
    """A tensor-less GGUF v3 file with string metadata."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(metadata))]
    for key, value in metadata.items():
        k, v = key.encode(), value.encode()
        out += [struct.pack("<Q", len(k)), k, struct.pack("<IQ", 8, len(v)), v]
    return b"".join(out)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such model file"):
        LlamaBackend(tmp_path / "nope.gguf")


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("these are my notes, not a model")
    with pytest.raises(ModelLoadError, match="not a usable GGUF model file: not a GGUF file"):
        LlamaBackend(bad)


def test_empty_file(tmp_path: Path) -> None:
    bad = tmp_path / "empty.gguf"
    bad.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="shorter than its magic"):
        LlamaBackend(bad)


def test_truncated_gguf(tmp_path: Path, gemma_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with gemma_path.open("rb") as src:
        cut.write_bytes(src.read(40_000_000))
    with pytest.raises(ModelLoadError, match="truncated: the tensor data ends at byte"):
        LlamaBackend(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(cut.read_bytes()[:100_000])  # cut inside the tokenizer arrays
    with pytest.raises(ModelLoadError, match="truncated: header ends"):
        LlamaBackend(head)


def test_corrupt_counts_fail_cleanly(tmp_path: Path) -> None:
    bad = tmp_path / "huge.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1))
    with pytest.raises(ModelLoadError, match="corrupt"):
        LlamaBackend(bad)


def test_header_reader_reports_the_model(gemma_path: Path) -> None:
    h = gguf.read_file(gemma_path)
    assert h.architecture == "gemma3"
    assert h.chat_template is None
    quants = h.quant_types()
    assert (quants["Q5_0"], quants["Q4_K"], quants["Q8_0"], quants["Q6_K"]) == (81, 27, 10, 9)
    assert h.array_lengths["tokenizer.ggml.tokens"] == 262144
    assert h.data_offset + h.tensor_bytes <= gemma_path.stat().st_size


def test_drafter_that_is_not_a_text_model(tmp_path: Path, gemma_path: Path) -> None:
    projector = tmp_path / "mmproj.gguf"
    projector.write_bytes(_gguf_bytes({"general.architecture": "clip", "general.name": "vision projector"}))
    with pytest.raises(DrafterUnusable, match="drafter cannot be used"):
        Engine(gemma_path, projector, settings("model"))


def test_unreadable_drafter(tmp_path: Path, gemma_path: Path) -> None:
    with pytest.raises(DrafterUnusable, match="is a folder, not a model file"):
        Engine(gemma_path, tmp_path, settings("model"))
    garbage = tmp_path / "draft.gguf"
    garbage.write_bytes(b"\x00" * 1024)
    with pytest.raises(DrafterUnusable, match="not a GGUF file"):
        Engine(gemma_path, garbage, settings("model"))


def test_context_overflow_and_limits(gemma_path: Path) -> None:
    with Engine(gemma_path, None, settings("ngram", n_ctx=256)) as engine:
        too_long = engine.tokenize_text("word " * 400)
        with pytest.raises(ContextLengthExceeded, match="context holds 256"):
            list(engine.generate(GenerationRequest(prompt=too_long, max_tokens=8)))
        with pytest.raises(InvalidRequest, match="empty"):
            list(engine.generate(GenerationRequest(prompt=[], max_tokens=8)))
        with pytest.raises(InvalidRequest, match="max_tokens"):
            list(engine.generate(GenerationRequest(prompt=[2, 3], max_tokens=0)))
        # A generation that reaches the end of the context stops with "length", and the engine goes on.
        near_full = engine.tokenize_text("one two three " * 80)[:250]
        chunks = list(engine.generate(GenerationRequest(prompt=near_full, max_tokens=100)))
        assert chunks[-1].finish_reason == "length"
        assert len(near_full) + sum(len(c.tokens) for c in chunks) <= 256
        ok = list(engine.generate(GenerationRequest(prompt=engine.tokenize_text("Hello"), max_tokens=4)))
        assert sum(len(c.tokens) for c in ok) == 4


def test_settings_that_cannot_work_together_fail_at_load(gemma_path: Path) -> None:
    too_narrow = Settings(
        engine=EngineSettings(n_ctx=512, n_batch=32, n_threads=2), draft=DraftSettings(max_draft=40)
    )
    with pytest.raises(ConfigError, match=r"engine.n_batch 32 is smaller than draft.max_draft \+ 1 = 41"):
        Engine(gemma_path, None, too_narrow)
    plain = Settings(
        engine=EngineSettings(n_ctx=512, n_batch=32, n_threads=2), draft=DraftSettings(mode="none")
    )
    with Engine(gemma_path, None, plain) as engine:  # no drafts: no verify pass to fit
        assert engine.drafter is None
