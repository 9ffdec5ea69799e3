"""The engine a window runs: its launch, as a device chosen, a first model installed or a pair loaded
change it, and its process, started once a leftover engine of an earlier window has ended."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.services.engine import READY, STARTING, EngineLaunch, EngineProcess
from app.services.leftover import LeftoverEngines


class EngineControl(QObject):
    """`process` runs `launch`; `start()` ends a leftover engine first and `leftoversEnded` says what it
    ended, in words (empty: nothing was left over)."""

    leftoversEnded = Signal(list)

    def __init__(self, launch: EngineLaunch, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.launch = launch
        self.process = EngineProcess(self)
        self.leftovers = LeftoverEngines(self)
        self.leftovers.finished.connect(self._leftovers_ended)

    def start(self) -> None:
        """End a leftover engine of an earlier window, if there is one, then start this window's."""
        self.leftovers.check()

    def restart(self) -> None:
        """Start the engine again on the current launch (a pair loaded from the library included)."""
        self.process.restart(self.launch.argv())

    def use_device(self, device: str) -> None:
        """Restart the engine on `device` (auto, cpu, gpu, gpu:N)."""
        self.launch = self.launch.with_engine(device=device)
        self.process.stop()
        self.process.start(self.launch.argv())

    def set_target(self, path: str) -> None:
        """Run the model at `path` from the next start on (the first model, just installed)."""
        self.launch = self.launch.with_target(path)

    def keep_pair(self, target: str, draft_model: str | None, ngram: bool, mmproj: str | None) -> None:
        """A pair the running engine loaded: a restart (after a crash) keeps it."""
        self.launch = self.launch.with_pair(target, draft_model, ngram, mmproj)

    def _leftovers_ended(self, notes: list[str]) -> None:
        self.leftoversEnded.emit(notes)
        if self.process.state not in (STARTING, READY):
            self.process.start(self.launch.argv())
