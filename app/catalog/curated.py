"""The curated pairs (target, drafter, optional mmproj) from the data file `pairs.toml`.

Every entry names exact Hugging Face repos and files; `verified` says whether those names were checked
against a public source, and the CLI and GUI show "unverified" where they were not.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from app.catalog import fit
from app.catalog.download import FileSpec

SCHEMA = 1


class CatalogError(ValueError):
    """The catalog data file is malformed; the message names the entry and the key."""


@dataclass(frozen=True)
class ModelFile:
    repo: str
    files: tuple[str, ...]
    size: int = 0
    size_exact: bool = False
    sha256: str = ""
    quant: str = ""
    params_b: float = 0.0
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0

    def shape(self, context_length: int = 0) -> fit.ModelShape:
        return fit.ModelShape(
            self.size, self.layers, self.kv_heads, self.head_dim, self.head_dim, context_length
        )

    def specs(self, role: str) -> list[FileSpec]:
        sha = self.sha256 if len(self.files) == 1 else ""
        return [FileSpec(self.repo, f, role, catalog_sha256=sha) for f in self.files]

    @property
    def first(self) -> str:
        """The file to load (a sharded model loads through its first shard)."""
        return self.files[0]


@dataclass(frozen=True)
class Pair:
    id: str
    name: str
    family: str
    architecture: str
    license: str
    context_length: int
    verified: bool
    sources: tuple[str, ...]
    draft_mode: str
    max_draft: int
    target: ModelFile
    drafter: ModelFile
    mmproj: ModelFile | None = None
    notes: str = ""

    @property
    def vision(self) -> bool:
        return self.mmproj is not None

    def need(self, kv_type: str = "f16") -> fit.PairNeed:
        return fit.PairNeed(
            self.target.shape(self.context_length),
            self.drafter.shape(self.context_length),
            self.mmproj.size if self.mmproj else 0,
            kv_type,
        )

    def file_specs(self) -> list[FileSpec]:
        specs = self.target.specs("target") + self.drafter.specs("drafter")
        return specs + (self.mmproj.specs("mmproj") if self.mmproj else [])

    @property
    def download_bytes(self) -> int:
        return sum(m.size for m in (self.target, self.drafter, self.mmproj) if m is not None)


_FILE_KEYS = {f for f in ModelFile.__dataclass_fields__}
_PAIR_KEYS = {f for f in Pair.__dataclass_fields__} - {"target", "drafter", "mmproj"}
_REQUIRED = {"id", "name", "architecture", "license", "context_length", "verified", "target", "drafter"}


def _model_file(data: Any, where: str) -> ModelFile:
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: expected a table")
    unknown = set(data) - _FILE_KEYS
    if unknown:
        raise CatalogError(f"{where}: unknown keys {sorted(unknown)}")
    if not data.get("repo") or "/" not in data["repo"]:
        raise CatalogError(f"{where}: 'repo' must be owner/name")
    files = data.get("files")
    if not files or not all(isinstance(f, str) and f.endswith(".gguf") for f in files):
        raise CatalogError(f"{where}: 'files' must list .gguf file names")
    sha = data.get("sha256", "")
    if sha and (len(sha) != 64 or len(files) != 1):
        raise CatalogError(f"{where}: 'sha256' must be 64 hex digits of a single-file entry")
    try:
        return ModelFile(**{**data, "files": tuple(files)})
    except TypeError as exc:
        raise CatalogError(f"{where}: {exc}") from exc


def parse(data: dict[str, Any]) -> list[Pair]:
    if data.get("schema") != SCHEMA:
        raise CatalogError(f"catalog schema {data.get('schema')!r} is not {SCHEMA}")
    pairs: list[Pair] = []
    seen: set[str] = set()
    for n, entry in enumerate(data.get("pair", [])):
        where = f"pair {entry.get('id', n)!r}"
        missing = _REQUIRED - set(entry)
        if missing:
            raise CatalogError(f"{where}: missing {sorted(missing)}")
        unknown = set(entry) - _PAIR_KEYS - {"target", "drafter", "mmproj"}
        if unknown:
            raise CatalogError(f"{where}: unknown keys {sorted(unknown)}")
        if entry["id"] in seen:
            raise CatalogError(f"{where}: duplicate id")
        seen.add(entry["id"])
        fields = {k: entry[k] for k in _PAIR_KEYS if k in entry}
        fields.setdefault("family", "")
        fields.setdefault("draft_mode", "token")
        fields.setdefault("max_draft", 8)
        fields["sources"] = tuple(entry.get("sources", ()))
        pairs.append(
            Pair(
                **fields,
                target=_model_file(entry["target"], f"{where} target"),
                drafter=_model_file(entry["drafter"], f"{where} drafter"),
                mmproj=_model_file(entry["mmproj"], f"{where} mmproj") if "mmproj" in entry else None,
            )
        )
    return pairs


def load(path: Path | None = None) -> list[Pair]:
    """The curated pairs (the packaged data file unless a path is given)."""
    if path is None:
        raw = resources.files("app.catalog").joinpath("pairs.toml").read_bytes()
    else:
        raw = Path(path).read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"catalog is not valid TOML: {exc}") from exc
    return parse(data)


def find(pair_id: str, pairs: list[Pair] | None = None) -> Pair:
    pairs = load() if pairs is None else pairs
    for p in pairs:
        if p.id == pair_id:
            return p
    raise KeyError(f"no pair {pair_id!r} in the catalog; `python -m app models list` shows them")
