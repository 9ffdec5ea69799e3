"""What a runner loads, as data: the target and drafter and the settings to load them by (a child process
gets it over its connection and loads it there)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.catalog.packaged import resolve_model
from app.config import Settings
from app.devices import placement
from app.engine.engine import Engine
from app.server.assembly import assemble_packaged

_FROM_SETTINGS: Any = object()


@dataclass(frozen=True)
class LoadRequest:
    """A target and its drafter (paths or packaged models' keys) and the settings to load them by."""

    settings: Settings
    target: str
    draft: str | None = None

    @classmethod
    def of(
        cls,
        settings: Settings,
        target: str | Path,
        draft: str | Path | None,
        mode: str | None = None,
        mmproj: str | Path | None = _FROM_SETTINGS,
    ) -> LoadRequest:
        """`mode` overrides settings.draft.mode, `mmproj` settings.engine.mmproj (None: no projector)."""
        if mode is not None:
            settings = settings.model_copy(update={"draft": settings.draft.model_copy(update={"mode": mode})})
        if mmproj is not _FROM_SETTINGS:
            projector = str(mmproj) if mmproj else None
            settings = settings.model_copy(
                update={"engine": settings.engine.model_copy(update={"mmproj": projector})}
            )
        return cls(settings, str(target), str(draft) if draft else None)

    def __call__(self, progress: Callable[[str], None]) -> Engine:
        """Build the Engine, reporting its stages by name: a packaged model's first assembly, finding
        devices, then the Engine's own stages."""
        assemble_packaged([self.target, self.draft], progress)
        target_path = resolve_model(self.target)
        draft_path = resolve_model(self.draft) if self.draft else None
        if placement.is_automatic(self.settings):
            progress("finding devices")
        settled, placed = placement.settle(self.settings, target_path, draft_path)
        engine = Engine(target_path, draft_path, settled, progress)
        engine.placement = placement.describe(placed)
        return engine
