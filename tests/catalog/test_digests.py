"""A model file's SHA-256: read whole, stoppable mid-file, and cached once per version of the file (its
path, size and modification time)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from app.catalog.digests import sha256_file, sha256_of


def test_the_digest_is_computed_once_per_version_of_the_file(tmp_path: Path) -> None:
    model, cache = tmp_path / "model.gguf", tmp_path / "digests.json"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 4096)
    first = sha256_of(model, cache)
    assert first == hashlib.sha256(model.read_bytes()).hexdigest()
    assert json.loads(cache.read_text())[str(model.resolve())]["sha256"] == first

    # same size and modification time, other bytes: the cached digest stands (the file is not read again)
    st = model.stat()
    model.write_bytes(b"FUGG" + bytes(range(256)) * 4096)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sha256_of(model, cache) == first

    # a new modification time is a new version: hashed again
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second = sha256_of(model, cache)
    assert second == hashlib.sha256(model.read_bytes()).hexdigest() != first


def test_an_unreadable_cache_is_rebuilt(tmp_path: Path) -> None:
    model, cache = tmp_path / "model.gguf", tmp_path / "digests.json"
    model.write_bytes(b"weights")
    cache.write_text("{not json")
    assert sha256_of(model, cache) == hashlib.sha256(b"weights").hexdigest()
    assert str(model.resolve()) in json.loads(cache.read_text())


def test_a_read_stops_where_its_interrupt_raises(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(bytes(range(256)) * (3 * 4096 * 4 + 1))  # 12 MiB + 256 bytes: four 4 MiB chunks
    assert sha256_file(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    chunks: list[int] = []

    def stop_at_the_third() -> None:
        chunks.append(len(chunks))
        if len(chunks) == 3:
            raise InterruptedError("stopped")

    with pytest.raises(InterruptedError, match="stopped"):
        sha256_file(model, stop_at_the_third)
    assert len(chunks) == 3
