"""The local model library: scan, import in place or by copy, remove, verify."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.catalog import download, gguf, manifest
from app.catalog.digests import sha256_file
from app.catalog.library import Library, LocalModel


def _own(models: list[LocalModel]) -> list[LocalModel]:
    """The library minus the packaged test models, which every machine running these tests has."""
    return [m for m in models if m.source != "packaged"]


@pytest.fixture
def gemma_link(gemma_path: Path, tmp_path: Path) -> Path:
    """The gemma test model under another folder (a hard link where possible: no 240 MB copy)."""
    path = tmp_path / "elsewhere" / "gemma.gguf"
    path.parent.mkdir()
    try:
        os.link(gemma_path, path)
    except OSError:
        path.write_bytes(gemma_path.read_bytes())
    return path


def test_import_in_place_registers_without_copying_and_remove_only_forgets(
    tmp_path: Path, gemma_link: Path
) -> None:
    lib = Library(tmp_path / "models")
    model = lib.import_file(gemma_link)
    assert model.architecture == "gemma3"
    assert model.source == "import"
    listed = _own(lib.scan(include_hf_cache=False))
    assert [m.path for m in listed] == [gemma_link.resolve()]
    assert not any((tmp_path / "models").rglob("*.gguf"))  # nothing was copied
    assert "forgot" in lib.remove(gemma_link)
    assert gemma_link.exists()  # the user's own file is never deleted
    assert _own(lib.scan(include_hf_cache=False)) == []


def test_import_by_copy_then_remove_deletes_the_copy(tmp_path: Path, gemma_link: Path) -> None:
    lib = Library(tmp_path / "models")
    model = lib.import_file(gemma_link, copy=True)
    assert model.path.parent == tmp_path / "models" / "imported"
    assert model.path.stat().st_size == gemma_link.stat().st_size
    with pytest.raises(FileExistsError):
        lib.import_file(gemma_link, copy=True)
    assert "deleted" in lib.remove(model.path)
    assert not model.path.exists()
    assert gemma_link.exists()


def test_import_refuses_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model")
    lib = Library(tmp_path / "models")
    with pytest.raises(gguf.GGUFError, match="not a GGUF file"):
        lib.import_file(bad)
    with pytest.raises(FileNotFoundError):
        lib.import_file(tmp_path / "missing.gguf")
    assert manifest.read(tmp_path / "models") == {}


def test_scan_finds_dropped_files_and_reports_broken_ones(tmp_path: Path, gemma_link: Path) -> None:
    models = tmp_path / "models"
    (models / "mine").mkdir(parents=True)
    os.link(gemma_link, models / "mine" / "g.gguf")
    (models / "mine" / "broken.gguf").write_bytes(gemma_link.read_bytes()[:4096])
    (models / "mine" / "big-00002-of-00002.gguf").write_bytes(b"GGUF")  # a later shard: not listed
    found = {m.path.name: m for m in _own(Library(models).scan(include_hf_cache=False))}
    assert set(found) == {"g.gguf", "broken.gguf"}
    assert found["g.gguf"].source == "found"
    assert not found["g.gguf"].problem
    assert "truncated" in found["broken.gguf"].problem


def test_verify_catches_a_changed_byte_in_a_downloaded_file(tmp_path: Path, gemma_link: Path) -> None:
    models = tmp_path / "models"
    final = download.library_path(models, "google/gemma-test", "g.gguf")
    final.parent.mkdir(parents=True)
    final.write_bytes(gemma_link.read_bytes())
    key = str(final.relative_to(models))
    record = {"source": "hub", "sha256": sha256_file(final), "size": 1}
    manifest.write(models, {key: record})
    lib = Library(models)
    assert [why.split(" ")[0] for m, why in lib.verify() if m.source != "packaged"] == ["ok"]
    with final.open("r+b") as f:
        f.seek(100_000_000)
        byte = f.read(1)
        f.seek(100_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    (result,) = [r for r in lib.verify() if r[0].source != "packaged"]
    assert "SHA-256 mismatch" in result[1]


def test_cli_import_library_remove(tmp_path: Path, gemma_link: Path) -> None:
    env = {**os.environ, "FORESIGHT_MODELS__DIR": str(tmp_path / "models"), "FORESIGHT_MODELS__HF_CACHE": "0"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "app", "models", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    assert cli("import", str(gemma_link)).returncode == 0
    listed = json.loads(cli("library", "--json").stdout)
    assert [m["path"] for m in listed["models"] if m["source"] != "packaged"] == [str(gemma_link.resolve())]
    refused = cli("remove", "gemma.gguf")
    assert refused.returncode == 2
    assert "--yes" in refused.stderr
    assert cli("remove", "gemma.gguf", "--yes").returncode == 0
    assert [
        m for m in json.loads(cli("library", "--json").stdout)["models"] if m["source"] != "packaged"
    ] == []
    bad = cli("import", str(tmp_path / "missing.gguf"))
    assert bad.returncode == 1
    assert "no such model file" in bad.stderr
