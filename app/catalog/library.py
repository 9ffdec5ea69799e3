"""The local model library: the models folder, imported GGUF files, the Hugging Face cache.

Downloaded files live under the models folder (`<models>/<owner>/<repo>/<file>`) and are listed in its
manifest with their SHA-256. Importing a file elsewhere registers it where it is (no copy of
gigabytes) or copies it in atomically. Removing deletes only files inside the models folder; an
imported file outside it is only forgotten.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from app.catalog import download, gguf, manifest
from app.catalog.digests import sha256_file

log = logging.getLogger(__name__)


@dataclass
class LocalModel:
    path: Path
    size: int
    source: str  # hub | import | copy | found | packaged | hf-cache
    architecture: str = ""
    name: str = ""
    repo: str = ""
    sha256: str | None = None
    problem: str = ""  # why the file is not a usable GGUF, if it is not

    @property
    def is_mmproj(self) -> bool:
        return self.architecture == "clip" or "mmproj" in self.path.name.lower()

    def as_dict(self) -> dict:
        return {
            "path": str(self.path),
            "size": self.size,
            "source": self.source,
            "architecture": self.architecture,
            "name": self.name,
            "repo": self.repo,
            "sha256": self.sha256,
            "problem": self.problem,
        }


def _describe(path: Path, source: str, entry: dict | None = None) -> LocalModel:
    entry = entry or {}
    model = LocalModel(path, 0, source, repo=entry.get("repo", ""), sha256=entry.get("sha256"))
    try:
        model.size = path.stat().st_size
        header = gguf.read_file(path)
        model.architecture, model.name = header.architecture, header.name
    except (OSError, gguf.GGUFError) as exc:
        model.problem = str(exc)
    return model


_SHARD = re.compile(r"^(?P<base>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})$")


def _is_shard_tail(path: Path) -> bool:
    """Shards after the first (`-00002-of-00003.gguf`) are loaded through the first one."""
    m = _SHARD.match(Path(path).stem)
    return m is not None and m["index"] != "00001"


def _shards(path: Path) -> list[Path]:
    """Every shard of a sharded model given its first file; the file alone otherwise."""
    m = _SHARD.match(path.stem)
    if m is None:
        return [path]
    count = int(m["count"])
    return [path.with_name(f"{m['base']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


class Library:
    def __init__(self, models_dir: Path) -> None:
        self.models_dir = Path(models_dir)

    def scan(self, include_hf_cache: bool = True) -> list[LocalModel]:
        """Every GGUF the app knows: the manifest, files dropped into the models folder, the HF cache."""
        records = manifest.read(self.models_dir)
        seen: set[Path] = set()
        models = []
        for key, entry in sorted(records.items()):
            path = Path(entry["path"]) if "path" in entry else self.models_dir / key
            seen.add(path.resolve())
            if _is_shard_tail(path):
                continue
            if not path.exists():
                models.append(LocalModel(path, 0, entry.get("source", "hub"), problem="missing"))
                continue
            models.append(_describe(path, entry.get("source", "hub"), entry))
        if self.models_dir.is_dir():
            for path in sorted(self.models_dir.rglob("*.gguf")):
                rel = path.relative_to(self.models_dir)
                if rel.parts[0] == download.PARTIAL_DIR or path.resolve() in seen or _is_shard_tail(path):
                    continue
                seen.add(path.resolve())
                models.append(_describe(path, "found"))
        for model in self._packaged():
            if model.path.resolve() not in seen:
                seen.add(model.path.resolve())
                models.append(model)
        if include_hf_cache:
            models.extend(m for m in self._hf_cache() if m.path.resolve() not in seen)
        return models

    def _packaged(self) -> list[LocalModel]:
        """The models installed from PyPI packages (the default model), once assembled."""
        from app.catalog.packaged import PACKAGED

        found = []
        for key, packaged in PACKAGED.items():
            path = packaged.cache_path()
            if path.with_suffix(".verified").exists() and path.exists():
                model = _describe(path, "packaged")
                model.repo, model.sha256 = f"packaged:{key}", packaged.sha256
                found.append(model)
        return found

    def _hf_cache(self) -> list[LocalModel]:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound

        try:
            info = scan_cache_dir()
        except (CacheNotFound, OSError):
            return []
        found = []
        for repo in info.repos:
            for revision in repo.revisions:
                for f in revision.files:
                    if f.file_name.endswith(".gguf") and not _is_shard_tail(f.file_path):
                        model = _describe(Path(f.file_path), "hf-cache")
                        model.repo = repo.repo_id
                        found.append(model)
        return found

    def import_file(self, path: Path, copy: bool = False) -> LocalModel:
        """Register a GGUF file (checked first); with copy=True, copy it into the models folder."""
        path = Path(path).expanduser().resolve()
        gguf.read_file(path)  # FileNotFoundError / GGUFError: nothing is registered
        entry = {"source": "import", "size": path.stat().st_size, "sha256": None}
        if copy:
            dest = self.models_dir / "imported" / path.name
            if dest.exists():
                raise FileExistsError(f"{dest} already exists in the models folder")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            try:
                shutil.copyfile(path, tmp)
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            key = str(dest.relative_to(self.models_dir))
            entry["source"] = "copy"
            path = dest
        else:
            key = f"import:{path}"
            entry["path"] = str(path)
        manifest.add(self.models_dir, key, entry)
        return _describe(path, "import", entry)

    def resolve(self, name: str) -> Path:
        """A library file by path, file name or `owner/repo/file` key."""
        direct = Path(name).expanduser()
        if direct.is_file():
            return direct
        matches = [
            m.path
            for m in self.scan(include_hf_cache=False)
            if m.path.name == name or str(m.path).endswith(name)
        ]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise FileNotFoundError(f"no model {name!r} in the library ({self.models_dir})")
        raise ValueError(f"{name!r} matches several models: " + ", ".join(str(m) for m in matches))

    def remove(self, path: Path) -> str:
        """Remove a model: delete it when it lives in the models folder, else only forget the import.

        Only model files the library lists can be removed (never the manifest, a folder or a stray
        file); a sharded model goes with all its shards.
        """
        resolved = Path(path).expanduser().resolve()
        listed = {m.path.resolve(): m for m in self.scan(include_hf_cache=False) if m.source != "packaged"}
        if resolved not in listed:
            raise FileNotFoundError(f"{path} is not a model in the library")
        root = self.models_dir.resolve()
        inside = root in resolved.parents
        with manifest.lock(self.models_dir):
            records = manifest.read(self.models_dir)
            files = _shards(resolved) if inside else [resolved]

            def listed_as(key: str, entry: dict) -> Path:
                return (Path(entry["path"]) if "path" in entry else root / key).resolve()

            for key in [k for k, e in records.items() if listed_as(k, e) in files]:
                del records[key]
            manifest.write(self.models_dir, records)
        if not inside:
            return f"forgot {path} (the file itself was left where it is)"
        for f in files:
            f.unlink(missing_ok=True)
        parent = resolved.parent
        while parent != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
        return f"deleted {path}" + (f" and its {len(files) - 1} other shards" if len(files) > 1 else "")

    def verify(self) -> list[tuple[LocalModel, str]]:
        """Re-hash every recorded file and re-read every header: (model, 'ok' or what is wrong)."""
        results = []
        for model in self.scan(include_hf_cache=False):
            if model.problem:
                results.append((model, model.problem))
                continue
            if model.sha256:
                actual = sha256_file(model.path)
                if actual != model.sha256:
                    results.append((model, f"SHA-256 mismatch: expected {model.sha256}, found {actual}"))
                    continue
                results.append((model, "ok (SHA-256 matches the hub's)"))
            else:
                results.append((model, "ok (header readable; no recorded hash)"))
        return results
