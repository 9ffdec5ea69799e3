"""The models manifest: what was installed into the models folder, from where, with which hash and size."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from filelock import FileLock

from app import paths

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


def read(models_dir: Path) -> dict[str, dict]:
    """The record of installed files; an unreadable one is set aside (never overwritten) and read as empty."""
    path = models_dir / MANIFEST
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        aside = path.with_name(f"{MANIFEST}.bad-{int(time.time())}")
        log.warning("%s is unreadable (%s); kept as %s", path, exc, aside.name)
        os.replace(path, aside)
        return {}
    return data


def write(models_dir: Path, data: dict[str, dict]) -> None:
    """Write the manifest atomically (a crash leaves the old or the new one, never half of it)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(models_dir / MANIFEST, json.dumps(data, indent=1, sort_keys=True))


def lock(models_dir: Path) -> FileLock:
    """Held around every read-modify-write of the manifest, across threads and processes."""
    models_dir.mkdir(parents=True, exist_ok=True)
    return FileLock(str(models_dir / f".{MANIFEST}.lock"))


def add(models_dir: Path, key: str, entry: dict) -> None:
    """Record one installed file under `key` (its path in the models folder, or `import:<path>`), stamped
    with when it was added."""
    entry = {**entry, "added": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with lock(models_dir):
        data = read(models_dir)
        data[key] = entry
        write(models_dir, data)
