"""The first start without a model: the banner offers the download, shows its progress, and hands the
downloaded file to the window, which starts its engine on it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.catalog.download import FileSpec, Progress
from app.services.downloads import DownloadTask
from app.ui.banner import Banner

PAUSE_WAIT_S = 10  # how long closing the window waits for a download to reach its pause


class FirstRun(QObject):
    """The download offer: `offer` shows it, the banner's Download button starts it, and `installed`
    gives the first file's path once every file is in."""

    installed = Signal(str)

    def __init__(self, banner: Banner, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.banner = banner
        self.task: DownloadTask | None = None
        self._offer: tuple[list[FileSpec], Path, str | None, str | None] | None = None
        banner.download_button.clicked.connect(self.start)

    def offer(
        self,
        files: list[FileSpec],
        models_dir: Path,
        what: str,
        token: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        """Nothing to load yet: offer to download `files` (`what` names them for the user)."""
        self._offer = (files, models_dir, token, endpoint)
        self.banner.say(
            f"No model on this computer yet. Download {what} from Hugging Face to start.", kind="info"
        )
        self._show_button("Download")

    def start(self) -> None:
        if self._offer is None or (self.task is not None and self.task.running):
            return
        self.task = DownloadTask(*self._offer, parent=self)
        self.task.progress.connect(self._progress)
        self.task.finished.connect(self._downloaded)
        self.task.failed.connect(self._failed)
        self.banner.download_button.setEnabled(False)
        self.task.start()

    def pause(self) -> None:
        """Pause a running download (the window closes): its .part file stays; the next start resumes it."""
        if self.task is not None and self.task.running:
            self.task.pause()
            self.task.wait(PAUSE_WAIT_S)

    def _progress(self, p: Progress) -> None:
        if p.state not in ("downloading", "verifying") or not p.total:
            return
        eta = f", {p.eta:.0f} s left" if p.eta is not None else ""
        self.banner.label.setText(
            f"{'Checking' if p.state == 'verifying' else 'Downloading'} {p.file}: {p.done / p.total:.0%}, "
            f"{p.done / 2**20:,.0f} of {p.total / 2**20:,.0f} MiB at {p.speed / 2**20:.1f} MiB/s{eta}"
        )

    def _downloaded(self, paths: list[str]) -> None:
        self.banner.download_button.hide()
        self.banner.dismiss()
        self.installed.emit(paths[0])

    def _failed(self, message: str) -> None:
        self.banner.say(f"The download failed: {message}")
        self._show_button("Try again")

    def _show_button(self, text: str) -> None:
        self.banner.download_button.setText(text)
        self.banner.download_button.setEnabled(True)
        self.banner.download_button.show()
