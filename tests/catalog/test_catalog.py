"""The curated catalog data file, and `models list` showing it with fit for this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from app.catalog import curated

CATALOG = Path(curated.__file__).with_name("pairs.toml")


def test_the_catalog_covers_the_families_with_at_least_ten_pairs() -> None:
    pairs = curated.load()
    assert len(pairs) >= 10
    families = {p.family for p in pairs}
    assert {"qwen2.5-coder", "qwen3", "llama3", "gemma3"} <= {f.split("-vl")[0] for f in families} | families
    assert any(p.vision and p.mmproj for p in pairs), "at least one vision pair with its mmproj"
    for p in pairs:
        assert p.target.size > p.drafter.size > 0, p.id
        assert p.sources, f"{p.id}: where the names were checked"
        assert min(p.target.layers, p.target.kv_heads, p.target.head_dim) > 0, p.id
        assert p.need().total(4096) > p.target.size


def test_every_pair_downloads_as_one_job_with_roles() -> None:
    for p in curated.load():
        specs = p.file_specs()
        roles = [s.role for s in specs]
        assert roles.count("target") == len(p.target.files)
        assert roles.count("drafter") == len(p.drafter.files)
        assert roles.count("mmproj") == (len(p.mmproj.files) if p.mmproj else 0)


def _edited(tmp_path: Path, edit) -> Path:
    data = tomllib.loads(CATALOG.read_text())
    edit(data)
    lines = [f"schema = {data['schema']}"]
    path = tmp_path / "pairs.toml"
    path.write_text(_dump(data, lines))
    return path


def _dump(data: dict, lines: list[str]) -> str:
    for pair in data["pair"]:
        lines.append("[[pair]]")
        tables = {}
        for key, value in pair.items():
            if isinstance(value, dict):
                tables[key] = value
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        for name, table in tables.items():
            lines.append(f"[pair.{name}]")
            lines.extend(f"{k} = {json.dumps(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["pair"][1].update(id=d["pair"][0]["id"]), "duplicate id"),
        (lambda d: d["pair"][0]["target"].update(repo="no-slash"), "owner/name"),
        (lambda d: d["pair"][0]["target"].update(files=["model.bin"]), ".gguf"),
        (lambda d: d["pair"][0].pop("license"), "missing"),
        (lambda d: d["pair"][0].update(colour="red"), "unknown keys"),
        (lambda d: d["pair"][0]["drafter"].update(sha256="abc"), "64 hex"),
    ],
)
def test_a_malformed_catalog_is_refused_naming_the_entry(tmp_path: Path, edit, message: str) -> None:
    with pytest.raises(curated.CatalogError, match=message):
        curated.load(_edited(tmp_path, edit))


def test_the_unedited_round_trip_loads(tmp_path: Path) -> None:
    assert curated.load(_edited(tmp_path, lambda d: None)) == curated.load()


def test_models_list_shows_fit_and_marks_unverified_entries(tmp_path: Path) -> None:
    unverified = _edited(tmp_path, lambda d: d["pair"][0].update(verified=False))
    env = {
        **os.environ,
        "FORESIGHT_MODELS__DIR": str(tmp_path / "models"),
        "FORESIGHT_MODELS__CATALOG": str(unverified),
    }

    def models_list(*extra: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "app", "models", "list", *extra], env=env, capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        return out.stdout

    rows = json.loads(models_list("--json"))["pairs"]
    assert len(rows) == len(curated.load())
    first = rows[0]
    assert first["verified"] is False
    assert first["fit"]["badge"]  # e.g. "CPU only" here, "fits gpu:0 @ 32k" on a GPU machine
    assert first["fit"]["placement"]["reason"]
    assert any("fits up to" in d or "does not fit" in d for d in first["fit"]["devices"])
    assert first["installed"] is False
    text = models_list()
    assert "[unverified" in text.splitlines()[0]
