"""Model downloads for the GUI: app.catalog.download's DownloadJob on a worker thread, as Qt signals."""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.catalog import download


class DownloadTask(QObject):
    """One download job (a pair is one job). Signals arrive on the thread that created the task."""

    progress = Signal(object)  # download.Progress
    finished = Signal(list)  # the installed paths, in the job's order
    failed = Signal(str)
    stopped = Signal(bool)  # True: paused (resumable), False: cancelled

    def __init__(
        self,
        files: list[download.FileSpec],
        models_dir: Path,
        token: str | None = None,
        endpoint: str | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.job = download.DownloadJob(files, models_dir, token, self.progress.emit, endpoint)
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._thread = threading.Thread(target=self._run, name="download", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        self.job.pause()

    def cancel(self) -> None:
        self.job.cancel()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            result = self.job.run()
        except download.DownloadStopped as stop:
            self.stopped.emit(stop.paused)
        except download.HubError as exc:
            self.failed.emit(str(exc))
        else:
            self.finished.emit([str(p) for p in result.paths])
