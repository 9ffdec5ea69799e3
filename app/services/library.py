"""The model library for the window: catalog rows with fit and download state, the local GGUF files, and
loading a pair into the running engine (POST /admin/load, read as server-sent events by the client's
EventStream).

Disk and header work (scanning the models folder, importing a file, a pairing verdict) runs on a short
worker thread, so the window never waits on a GGUF header; downloads run in `DownloadTask`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)

from app.catalog import curated, download, gguf, pairing
from app.catalog.library import Library, LocalModel
from app.services.client import EngineClient, event_error
from app.services.downloads import DownloadTask
from app.services.engine import AppCommand

ModelIndex = QModelIndex | QPersistentModelIndex
PAIR_ROLE = Qt.ItemDataRole.UserRole


# --- fit on this machine ------------------------------------------------------------------------

FIT_TIMEOUT_MS = 120_000
STOPPING_WAIT_S = 30  # a paused download's thread ends right after it said so


class FitScan(AppCommand):
    """`python -m app models list --json` in a child process: every pair's fit badge, placement and
    per-device summary, exactly as the CLI computes them (the device probes load GPU drivers, which stay
    out of the window's process, as with `DeviceScan`)."""

    scanned = Signal(dict)  # pair id -> {"badge", "placement", "devices", "installed"}
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(FIT_TIMEOUT_MS, parent)

    def start(self, models_dir: Path, catalog: Path | None = None) -> None:
        env = {"FORESIGHT_MODELS__DIR": str(models_dir)}
        if catalog is not None:
            env["FORESIGHT_MODELS__CATALOG"] = str(catalog)
        self._run(["models", "list", "--json"], env)

    def _result(self, code: int, out: str, err: str) -> None:
        try:
            rows = json.loads(out)["pairs"]
        except (ValueError, KeyError, TypeError):
            last = err.splitlines()[-1] if err else "no output"
            self.failed.emit(f"could not size the pairs for this machine (exit code {code}): {last}")
            return
        self.scanned.emit({r["id"]: {**r["fit"], "installed": r["installed"]} for r in rows})


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


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def describe_progress(p: download.Progress) -> str:
    """One line for a download: share, bytes, speed and time left."""
    if p.state == "planning":
        return "asking the hub for file sizes…"
    if p.state == "failed":
        return f"failed: {p.message}"
    share = f"{p.done / p.total:.0%}" if p.total else "0%"
    if p.state == "downloading":
        eta = f", {p.eta:.0f} s left" if p.eta is not None else ""
        return f"downloading {share} of {_size(p.total)} at {p.speed / 2**20:.1f} MiB/s{eta}"
    if p.state == "verifying":
        return f"verifying {p.file} ({share})"
    if p.state == "paused":
        return f"paused at {share}"
    return p.state


# --- background work ------------------------------------------------------------------------------


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


def read_verdict(target: Path, drafter: Path) -> pairing.Verdict:
    """The pairing verdict of two local GGUF files (their headers only)."""
    return pairing.check_pair(gguf.read_file(target), gguf.read_file(drafter), target.name, drafter.name)


# --- the catalog ---------------------------------------------------------------------------------


class _Table(QAbstractTableModel):
    """A flat table of `rows()`, headed by COLUMNS."""

    COLUMNS: tuple[str, ...] = ()

    def rows(self) -> list[Any]:
        raise NotImplementedError

    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows())

    def columnCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        return None


class CatalogModel(_Table):
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
                return _size(p.download_bytes)
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
            self.states[pair_id] = "paused"
            last = self.progress.get(pair_id, download.Progress("paused"))
            self.progress[pair_id] = dataclasses.replace(last, state="paused", speed=0.0, eta=None)
        else:
            self.tasks.pop(pair_id, None)
            self.states[pair_id] = "cancelled"
            self.progress.pop(pair_id, None)
        self._changed(pair_id)
        self.downloadStopped.emit(pair_id, paused)


# --- the local files -----------------------------------------------------------------------------


class LocalModels(_Table):
    """The GGUF files `Library.scan()` found; `scan()` reads them on a worker thread."""

    COLUMNS = ("File", "Size", "Architecture", "Source", "Problem")
    scanned = Signal()
    failed = Signal(str)

    def __init__(
        self, library: Library, include_hf_cache: bool = True, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.library = library
        self.include_hf_cache = include_hf_cache
        self.models: list[LocalModel] = []
        self._scan: Background | None = None
        self._again = False  # a scan was asked for while one ran: it may have missed what changed since

    def rows(self) -> list[LocalModel]:
        return self.models

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        m = self.models[index.row()]
        if role == PAIR_ROLE:
            return str(m.path)
        if role == Qt.ItemDataRole.ToolTipRole:
            return str(m.path)
        if role == Qt.ItemDataRole.DisplayRole:
            return (m.path.name, _size(m.size), m.architecture or "?", m.source, m.problem)[index.column()]
        return None

    def usable(self) -> list[LocalModel]:
        """Text models that can be loaded (no mmproj, no unreadable file)."""
        return [m for m in self.models if not m.problem and not m.is_mmproj]

    def projectors(self) -> list[LocalModel]:
        """Vision projectors (mmproj files) that can be loaded with a target."""
        return [m for m in self.models if not m.problem and m.is_mmproj]

    @property
    def scanning(self) -> bool:
        return self._scan is not None and self._scan.running

    def scan(self) -> None:
        """List the library in a thread; asked while a scan runs (a file imported meanwhile), scan again
        when it ends, so nothing registered after the running scan began is missed."""
        if self.scanning:
            self._again = True
            return
        self._scan = Background(lambda: self.library.scan(include_hf_cache=self.include_hf_cache), self)
        self._scan.done.connect(self._scanned)
        self._scan.failed.connect(self.failed)
        self._scan.failed.connect(lambda _message: self._rescan_if_asked())
        self._scan.start()

    def _rescan_if_asked(self) -> None:
        if self._again:
            self._again = False
            self._scan = None
            self.scan()

    def wait(self, timeout: float | None = None) -> None:
        if self._scan is not None:
            self._scan.wait(timeout)

    def _scanned(self, models: list[LocalModel]) -> None:
        self.beginResetModel()
        self.models = models
        self.endResetModel()
        self.scanned.emit()
        self._rescan_if_asked()


# --- loading a pair into the engine ----------------------------------------------------------------


class LoadStream(QObject):
    """One POST /admin/load: `stage` for each stage the engine reports, then `done` with the "ready"
    event (model, draft, context_length) or `failed` with the engine's message."""

    stage = Signal(str)
    done = Signal(dict)
    failed = Signal(str)

    def __init__(self, client: EngineClient, body: dict[str, Any], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ready: dict[str, Any] | None = None
        self._error = ""
        self._events = client.post_events("/admin/load", json.dumps(body).encode())
        self._events.setParent(self)
        self._events.event.connect(self._event)
        self._events.ended.connect(self._ended)

    def _event(self, event: dict[str, Any]) -> None:
        error = event_error(event)
        if error is not None:
            self._error = error
        elif "stage" in event:
            self.stage.emit(str(event["stage"]))
            if event["stage"] == "ready":
                self._ready = event

    def _ended(self, failure: str) -> None:
        error = self._error or failure  # refused before streaming: bad path, busy, bad token
        if error:
            self.failed.emit(error)
        elif self._ready is not None:
            self.done.emit(self._ready)
        else:
            self.failed.emit("the engine ended the load without saying it was ready")


def load_pair(
    client: EngineClient,
    target: str,
    draft: str | None = None,
    ngram: bool = False,
    parent: QObject | None = None,
    mmproj: str | None = None,
) -> LoadStream:
    """Ask the running engine to load `target` with a drafter model, n-gram drafting, or neither, and
    with a vision projector when `mmproj` is given."""
    body = {"target": target, "draft": draft, "ngram": bool(ngram and not draft), "mmproj": mmproj}
    return LoadStream(client, body, parent)
