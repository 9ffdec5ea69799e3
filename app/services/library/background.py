"""Disk and header work on a short worker thread (scanning the models folder, importing a file, a pairing
verdict), so the window never waits on a GGUF header."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal


class Background(QObject):
    """One call on a worker thread: `done` with its result or `failed` with the error's message."""

    done = Signal(object)
    failed = Signal(str)

    def __init__(self, work: Callable[[], Any], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._work = work
        self._thread = threading.Thread(target=self._run, name="library", daemon=True)

    def start(self) -> Background:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            result = self._work()
        except Exception as exc:  # every failure reaches the window as words
            self.failed.emit(
                str(exc.args[0]) if isinstance(exc, OSError | KeyError) and exc.args else str(exc)
            )
        else:
            self.done.emit(result)


class BackgroundJobs(QObject):
    """The Background calls one owner started and that have not ended yet, to join them all."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._jobs: set[Background] = set()

    def job(self, work: Callable[[], Any]) -> Background:
        """A Background call for `work` (not started yet), forgotten once it ends."""
        job = Background(work, self)
        self._jobs.add(job)
        job.done.connect(lambda _: self._jobs.discard(job))
        job.failed.connect(lambda _: self._jobs.discard(job))
        return job

    def wait(self, timeout: float | None = None) -> None:
        for job in list(self._jobs):
            job.wait(timeout)
