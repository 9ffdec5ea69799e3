"""The curated pairs as a table model: each pair's fit badge, whether its files are in, and its download
(one job per pair: start, pause, resume, cancel)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from app.catalog import curated, download
from app.services.downloads import DownloadTask
from app.services.library.table import PAIR_ROLE, ModelIndex, TableModel, size_text

STOPPING_WAIT_S = 30  # a paused download's thread ends right after it said so


def installed_paths(pair: curated.Pair, models_dir: Path) -> dict[str, Path] | None:
    """The pair's files to load ({"target", "drafter", and "mmproj" for a vision pair}) when every file
    is in, else None."""
    specs = pair.file_specs()
    if not all(download.library_path(models_dir, s.repo, s.filename).is_file() for s in specs):
        return None
    roles = [("target", pair.target), ("drafter", pair.drafter)]
    if pair.mmproj is not None:
        roles.append(("mmproj", pair.mmproj))
    return {role: download.library_path(models_dir, m.repo, m.first) for role, m in roles}


def describe_progress(p: download.Progress) -> str:
    """One line for a download: share, bytes, speed and time left."""
    if p.state == "planning":
        return "asking the hub for file sizes…"
    if p.state == "failed":
        return f"failed: {p.message}"
    share = f"{p.done / p.total:.0%}" if p.total else "0%"
    if p.state == "downloading":
        eta = f", {p.eta:.0f} s left" if p.eta is not None else ""
        return f"downloading {share} of {size_text(p.total)} at {p.speed / 2**20:.1f} MiB/s{eta}"
    if p.state == "verifying":
        return f"verifying {p.file} ({share})"
    if p.state == "paused":
        return f"paused at {share}"
    return p.state


class CatalogModel(TableModel):
    """The curated pairs with their fit badge, and the download state of each (one job per pair)."""

    COLUMNS = ("Pair", "Download", "Fit on this machine", "State")
    downloaded = Signal(str, list)  # pair id, the installed paths
    downloadFailed = Signal(str, str)  # pair id, message
    downloadStopped = Signal(str, bool)  # pair id, paused (False: cancelled)
    progressChanged = Signal(str)  # pair id

    def __init__(
        self,
        pairs: list[curated.Pair],
        models_dir: Path,
        token: str | None = None,
        endpoint: str | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.pairs = pairs
        self.models_dir = Path(models_dir)
        self.token = token
        self.endpoint = endpoint
        self.fits: dict[str, dict] = {}
        self.tasks: dict[str, DownloadTask] = {}
        self.progress: dict[str, download.Progress] = {}
        self.states: dict[str, str] = {}  # downloading | paused | cancelled | failed | done
        self.messages: dict[str, str] = {}
        self._installed = {p.id: installed_paths(p, self.models_dir) for p in pairs}

    # model ------------------------------------------------------------------------------------

    def rows(self) -> list[curated.Pair]:
        return self.pairs

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        p = self.pairs[index.row()]
        if role == PAIR_ROLE:
            return p.id
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if column == 0:
                flags = ([] if p.verified else ["unverified"]) + (["vision"] if p.vision else [])
                return p.name + (f" ({', '.join(flags)})" if flags else "")
            if column == 1:
                return size_text(p.download_bytes)
            if column == 2:
                return self.fits[p.id]["badge"] if p.id in self.fits else "checking this machine…"
            if self.states.get(p.id) == "failed":  # the reason is said once, under the table
                return "download failed"
            return self.state_text(p.id)
        if role == Qt.ItemDataRole.ToolTipRole:
            if column == 3:
                return self.state_text(p.id)
            if column == 2 and p.id in self.fits:
                found = self.fits[p.id]
                return "\n".join([found["placement"]["reason"], *found["devices"]])
            if column == 0:
                return "\n".join(
                    filter(None, [f"target {p.target.repo}/{p.target.first}",
                                  f"drafter {p.drafter.repo}/{p.drafter.first}", p.license, p.notes])
                )  # fmt: skip
        return None

    def pair(self, pair_id: str) -> curated.Pair:
        return curated.find(pair_id, self.pairs)

    def row_of(self, pair_id: str) -> int:
        return next(i for i, p in enumerate(self.pairs) if p.id == pair_id)

    def installed(self, pair_id: str) -> dict[str, Path] | None:
        return self._installed.get(pair_id)

    def state_text(self, pair_id: str) -> str:
        state = self.states.get(pair_id)
        if state in ("downloading", "paused") and pair_id in self.progress:
            return describe_progress(self.progress[pair_id])
        if state == "failed":
            return f"failed: {self.messages.get(pair_id, '')}"
        if self._installed.get(pair_id):
            return "installed"
        if state == "cancelled":
            return "cancelled"
        return "not downloaded"

    def set_fits(self, fits: dict[str, dict]) -> None:
        self.fits = fits
        if self.pairs:
            self.dataChanged.emit(self.index(0, 2), self.index(len(self.pairs) - 1, 2))

    def refresh_installed(self) -> None:
        self._installed = {p.id: installed_paths(p, self.models_dir) for p in self.pairs}
        if self.pairs:
            self.dataChanged.emit(self.index(0, 3), self.index(len(self.pairs) - 1, 3))

    def _changed(self, pair_id: str) -> None:
        row = self.row_of(pair_id)
        self.dataChanged.emit(self.index(row, 3), self.index(row, 3))
        self.progressChanged.emit(pair_id)

    # downloads --------------------------------------------------------------------------------

    def running(self, pair_id: str) -> bool:
        task = self.tasks.get(pair_id)
        return task is not None and task.running

    def download(self, pair_id: str) -> None:
        """Start the pair's download, or resume it after a pause (its .part files are kept)."""
        if self.running(pair_id):
            return
        task = self.tasks.get(pair_id)
        if task is None:
            files = self.pair(pair_id).file_specs()
            task = DownloadTask(files, self.models_dir, self.token, self.endpoint, self)
            task.progress.connect(lambda p, i=pair_id: self._progress(i, p))
            task.finished.connect(lambda paths, i=pair_id: self._finished(i, paths))
            task.failed.connect(lambda message, i=pair_id: self._failed(i, message))
            task.stopped.connect(lambda paused, i=pair_id: self._stopped(i, paused))
            self.tasks[pair_id] = task
        self.states[pair_id] = "downloading"
        self.progress[pair_id] = download.Progress("planning")
        self._changed(pair_id)
        task.start()

    def pause(self, pair_id: str) -> None:
        if self.running(pair_id):
            self.tasks[pair_id].pause()

    def cancel(self, pair_id: str) -> None:
        """Stop the download and delete its partial files (a running job deletes them itself)."""
        task = self.tasks.get(pair_id)
        if task is None:
            return
        paused = self.states.get(pair_id) == "paused"
        if task.running and not paused:
            task.cancel()
            return
        # paused: the job said so and returned, but its thread may not have ended yet (a busy machine):
        # a cancel sent to it now would never be answered, so no job runs to clean up after itself
        task.wait(STOPPING_WAIT_S)
        for p in task.job.plan_:
            p.part.unlink(missing_ok=True)
            p.part.with_name(p.part.name + ".json").unlink(missing_ok=True)  # hub's resume record
        self._stopped(pair_id, False)

    def wait(self, timeout: float | None = None) -> None:
        for task in self.tasks.values():
            task.wait(timeout)

    def _progress(self, pair_id: str, p: download.Progress) -> None:
        if p.state in ("planning", "downloading", "verifying"):
            self.progress[pair_id] = p
            self._changed(pair_id)

    def _finished(self, pair_id: str, paths: list) -> None:
        self.tasks.pop(pair_id, None)
        self.states[pair_id] = "done"
        self._installed[pair_id] = installed_paths(self.pair(pair_id), self.models_dir)
        self._changed(pair_id)
        self.downloaded.emit(pair_id, paths)

    def _failed(self, pair_id: str, message: str) -> None:
        self.tasks.pop(pair_id, None)
        self.states[pair_id] = "failed"
        self.messages[pair_id] = message
        self._changed(pair_id)
        self.downloadFailed.emit(pair_id, message)

    def _stopped(self, pair_id: str, paused: bool) -> None:
        if paused:
            # the job said so and returns: its thread ends at once, but until it has, the pair still
            # counts as running and Resume would stay disabled (seen on a busy machine)
            task = self.tasks.get(pair_id)
            if task is not None:
                task.wait(STOPPING_WAIT_S)
            self.states[pair_id] = "paused"
            last = self.progress.get(pair_id, download.Progress("paused"))
            self.progress[pair_id] = dataclasses.replace(last, state="paused", speed=0.0, eta=None)
        else:
            self.tasks.pop(pair_id, None)
            self.states[pair_id] = "cancelled"
            self.progress.pop(pair_id, None)
        self._changed(pair_id)
        self.downloadStopped.emit(pair_id, paused)
