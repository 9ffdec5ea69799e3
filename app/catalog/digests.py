"""SHA-256 of model files: read in one place, stoppable mid-file, and cached by path, size and mtime."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from app import paths

log = logging.getLogger("foresight.digests")

_lock = threading.Lock()


def sha256_file(path: str | Path, interrupt: Callable[[], None] | None = None) -> str:
    """The file's SHA-256 (hex), read whole. `interrupt` runs before each 4 MiB chunk and raises to stop
    the read (a download paused or cancelled while it verifies)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(4 << 20):
            if interrupt is not None:
                interrupt()
            digest.update(chunk)
    return digest.hexdigest()


def default_cache() -> Path:
    return paths.cache_dir() / "file-sha256.json"


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def _read(cache: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(cache.read_text())
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        log.warning("ignoring unreadable digest cache %s", cache)
        return {}


def sha256_of(path: str | Path, cache: Path | None = None) -> str:
    """sha256_file, cached: a file whose size and modification time are those of the last hash comes from
    the cache (`default_cache()` unless given), so a 1 GB model is read once, not at every load."""
    path = Path(path).resolve()
    cache = cache or default_cache()
    stamp = _stamp(path)
    with _lock:
        entry = _read(cache).get(str(path))
    if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    value = sha256_file(path)
    if _stamp(path) != stamp:  # written to while it was read: the digest is of no version; do not keep it
        return value
    with _lock:
        data = _read(cache)
        data[str(path)] = {"stamp": stamp, "sha256": value}
        try:
            paths.write_atomic(cache, json.dumps(data, indent=1, sort_keys=True))
        except OSError as exc:
            log.warning("could not keep the digest of %s in %s: %s", path.name, cache, exc)
    return value
