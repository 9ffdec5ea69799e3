"""Hugging Face downloads: a model pair is one job, resumable after a kill, verified, never half-installed.

huggingface_hub provides the endpoint (`HF_ENDPOINT` honoured), URLs, headers, file metadata (size, the
LFS SHA-256, the commit), error types and the ranged transfer itself (`http_get`, which retries
transient errors). Foresight adds what its own download entry points lack: a `.part` file that survives
a kill and is resumed by the next run (huggingface_hub 2.x deletes a partial download), pause and
cancel, one progress stream for all files of a pair, a disk-space check for the whole job before the
first byte, SHA-256 verification with one re-fetch on mismatch, and an atomic rename into the models
folder, so a file at its final path is always complete and verified.

The token comes from app.keystore (the OS keyring), never from files or logs.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import httpx2
from filelock import FileLock, Timeout
from huggingface_hub import get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers

from app.catalog import manifest
from app.catalog.digests import sha256_file
from app.catalog.remote import status_message

log = logging.getLogger(__name__)

PARTIAL_DIR = ".downloads"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SPACE_RESERVE = 256 << 20  # keep this much free beyond the download itself


# --- errors -----------------------------------------------------------------------------------------


class HubError(RuntimeError):
    """A download problem in words the user can act on; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotEnoughSpace(HubError):
    pass


class VerificationFailed(HubError):
    pass


class DownloadStopped(Exception):
    """Raised inside a transfer to stop it; `paused` keeps the partial file, cancel removes it."""

    def __init__(self, paused: bool) -> None:
        super().__init__("paused" if paused else "cancelled")
        self.paused = paused


def explain(exc: BaseException, what: str) -> HubError:
    """Turn a huggingface_hub/httpx error into a HubError whose message says what to do."""
    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if isinstance(exc, GatedRepoError):
            return HubError(status_message(403, what), status)
        if isinstance(exc, EntryNotFoundError):
            return HubError(f"{what}: no such file in the repo (404). Check the file name.", status)
        if isinstance(exc, RevisionNotFoundError):
            return HubError(f"{what}: no such revision (404).", status)
        if isinstance(exc, RepositoryNotFoundError) and status == 401:
            return HubError(
                f"{what}: the repo does not exist or is private (401). Check the repo id; for a private "
                "repo, sign in with a Hugging Face token that can read it.",
                status,
            )
        return HubError(status_message(status, what), status)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return HubError(f"{what}: the disk is full. Free some space; the download resumes where it stopped.")
    if isinstance(exc, httpx.HTTPError | httpx2.HTTPError):
        return HubError(f"{what}: network error, the hub could not be reached or the transfer broke ({exc})")
    if isinstance(exc, OSError):
        return HubError(f"{what}: {exc}")
    return HubError(f"{what}: {exc}")


# --- jobs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileSpec:
    repo: str
    filename: str
    role: str = "target"  # target | drafter | mmproj
    revision: str = "main"
    catalog_sha256: str = ""  # the hash the catalog recorded, when it has one

    @property
    def what(self) -> str:
        return f"{self.repo}/{self.filename}"


@dataclass
class PlannedFile:
    spec: FileSpec
    size: int
    sha256: str | None  # the LFS hash; None for a non-LFS file (verified by size only)
    commit: str
    url: str
    final: Path
    part: Path
    have: int = 0  # bytes already in the .part file (or the whole size when already installed)
    installed: bool = False


@dataclass
class Progress:
    """One snapshot for the GUI/CLI: the job's bytes, the current file, speed and ETA."""

    state: str  # planning | downloading | verifying | done | paused | cancelled | failed
    file: str = ""
    role: str = ""
    file_done: int = 0
    file_total: int = 0
    done: int = 0
    total: int = 0
    speed: float = 0.0  # bytes per second, smoothed
    eta: float | None = None  # seconds
    message: str = ""


@dataclass
class JobResult:
    paths: list[Path] = field(default_factory=list)
    bytes_downloaded: int = 0  # fetched by this run
    bytes_resumed: int = 0  # found in .part files and not fetched again
    refetched: list[str] = field(default_factory=list)  # files fetched again after a hash mismatch


def library_path(models_dir: Path, repo: str, filename: str) -> Path:
    """Where a hub file lives in the models folder: <models>/<owner>/<repo>/<filename>.

    Raises ValueError for names that could leave the folder (.., absolute paths, backslashes, drives).
    """
    parts = [*repo.split("/"), *filename.split("/")]
    if len(repo.split("/")) != 2 or any(p in ("", ".", "..") or "\\" in p or ":" in p for p in parts):
        raise ValueError(f"unsafe or malformed hub name: {repo}/{filename}")
    return models_dir.joinpath(*parts)


class _Speed:
    """Bytes per second over a sliding window of a few seconds."""

    def __init__(self, window: float = 5.0) -> None:
        self._window = window
        self._samples: list[tuple[float, int]] = []

    def add(self, done: int) -> float:
        now = time.monotonic()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window:
            self._samples.pop(0)
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


class DownloadJob:
    """Download files (a pair: target, drafter, mmproj, every shard) into the models folder as one job.

    `run()` blocks; `pause()` and `cancel()` may be called from any thread. A paused or killed job
    resumes from its `.part` files when run again.
    """

    def __init__(
        self,
        files: list[FileSpec],
        models_dir: Path,
        token: str | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        endpoint: str | None = None,
    ) -> None:
        if not files:
            raise ValueError("a download job needs at least one file")
        self.files = files
        self.models_dir = Path(models_dir)
        self.token = token
        self.endpoint = endpoint
        self.on_progress = on_progress or (lambda p: None)
        self._stop = threading.Event()
        self._paused = False
        self._speed = _Speed()
        self.progress = Progress("planning")
        self.plan_: list[PlannedFile] = []

    # control ------------------------------------------------------------------------------------

    def pause(self) -> None:
        self._paused = True
        self._stop.set()

    def cancel(self) -> None:
        self._paused = False
        self._stop.set()

    def _raise_if_stopped(self) -> None:
        if self._stop.is_set():
            raise DownloadStopped(self._paused)

    # planning -----------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return build_hf_headers(token=self.token if self.token else False, library_name="foresight")

    def plan(self) -> list[PlannedFile]:
        """Ask the hub for every file's size, hash and commit; note what is already here."""
        planned = []
        for spec in self.files:
            url = hf_hub_url(spec.repo, spec.filename, revision=spec.revision, endpoint=self.endpoint)
            try:
                meta = get_hf_file_metadata(
                    url, token=self.token if self.token else False, endpoint=self.endpoint
                )
            except Exception as exc:  # every failure becomes a HubError in words
                raise explain(exc, spec.what) from exc
            if meta.size is None or meta.commit_hash is None:
                raise HubError(f"{spec.what}: the hub did not report the file's size and commit")
            etag = (meta.etag or "").lower()
            if spec.catalog_sha256 and _SHA256.match(etag) and etag != spec.catalog_sha256:
                log.warning(
                    "%s: the hub's file (SHA-256 %s) is not the one the catalog recorded (%s); the "
                    "publisher has replaced it. The download is verified against the hub's hash.",
                    spec.what,
                    etag,
                    spec.catalog_sha256,
                )
            final = library_path(self.models_dir, spec.repo, spec.filename)
            part = library_path(self.models_dir / PARTIAL_DIR, spec.repo, spec.filename + ".part")
            # transfers go through the hub's resolve URL pinned to this commit (not the signed CDN link
            # of the HEAD, which expires): the token goes to the hub only; redirects drop it
            url = hf_hub_url(spec.repo, spec.filename, revision=meta.commit_hash, endpoint=self.endpoint)
            sha = etag if _SHA256.match(etag) else None
            p = PlannedFile(spec, meta.size, sha, meta.commit_hash, url, final, part)
            if final.is_file() and _installed_matches(self.models_dir, p):
                p.installed, p.have = True, p.size
            elif final.is_file() and sha and final.stat().st_size == p.size and sha256_file(final) == sha:
                _record(self.models_dir, p)  # installed by a run that stopped before recording it
                p.installed, p.have = True, p.size
            elif part.is_file() and _part_matches(part, p):
                p.have = min(part.stat().st_size, p.size)
            else:  # a partial file of another version (or without its record) is not resumed
                _drop_stale_part(part, p)
            planned.append(p)
        self.plan_ = planned
        return planned

    def check_space(self, planned: list[PlannedFile]) -> None:
        """Refuse, before the first byte, a job that would not fit in the models folder's free space."""
        need = sum(p.size - p.have for p in planned)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.models_dir).free
        if need + SPACE_RESERVE > free:
            raise NotEnoughSpace(
                f"not enough disk space in {self.models_dir}: the download needs {_gb(need)} more, "
                f"{_gb(free)} is free. Free some space or choose another models folder."
            )

    # running ------------------------------------------------------------------------------------

    def run(self) -> JobResult:
        """Download, verify and install every file; raises HubError, or DownloadStopped on pause/cancel."""
        self._stop.clear()
        result = JobResult()
        try:
            planned = self.plan()
            self.check_space(planned)
            total = sum(p.size for p in planned)
            done_before = 0
            for p in planned:
                self.progress = Progress(
                    "downloading", p.spec.filename, p.spec.role, p.have, p.size, done_before + p.have, total
                )
                if not p.installed:
                    self._fetch_locked(p, done_before, total, result)
                result.paths.append(p.final)
                done_before += p.size
            self._emit(Progress("done", done=total, total=total, message=f"{len(planned)} file(s) ready"))
            return result
        except DownloadStopped as stop:
            state = "paused" if stop.paused else "cancelled"
            if not stop.paused:
                for p in self.plan_:
                    p.part.unlink(missing_ok=True)
                    _sidecar(p.part).unlink(missing_ok=True)
            self._emit(Progress(state, done=self.progress.done, total=self.progress.total))
            raise
        except Exception as exc:
            error = explain(exc, self.progress.file or "download")
            self._emit(Progress("failed", message=str(error)))
            if error is exc:
                raise
            raise error from exc

    def _fetch_locked(self, p: PlannedFile, done_before: int, total: int, result: JobResult) -> None:
        """One job at a time per file: pairs share drafters, and the GUI and the CLI may both pull."""
        p.part.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(p.part) + ".lock"):
            if p.final.is_file() and _installed_matches(self.models_dir, p):
                p.installed = True  # another job finished it while this one waited
                return
            have = p.part.stat().st_size if p.part.is_file() and _part_matches(p.part, p) else 0
            result.bytes_resumed += min(have, p.size)
            self._fetch_verified(p, done_before, total, result)

    def _fetch_verified(self, p: PlannedFile, done_before: int, total: int, result: JobResult) -> None:
        for attempt in (1, 2):
            fetched = self._fetch(p, done_before, total)
            result.bytes_downloaded += fetched
            self._emit(self._snapshot(p, "verifying", done_before, total, p.size))
            actual = sha256_file(p.part, self._raise_if_stopped) if p.sha256 else None
            if p.part.stat().st_size == p.size and actual == p.sha256:
                break
            log.warning("%s failed verification (attempt %d)", p.spec.what, attempt)
            p.part.unlink(missing_ok=True)
            p.have = 0
            if attempt == 2:
                raise VerificationFailed(
                    f"{p.spec.what}: the downloaded file does not match the hub's SHA-256 twice in a row; "
                    "it was removed. The hub copy or the network is corrupting data: try again later."
                )
            result.refetched.append(p.spec.what)
        p.final.parent.mkdir(parents=True, exist_ok=True)
        _fsync(p.part)  # the bytes are on disk before the name says the file is complete
        os.replace(p.part, p.final)
        _fsync(p.final.parent)
        _sidecar(p.part).unlink(missing_ok=True)
        _record(self.models_dir, p)
        p.installed = True

    def _fetch(self, p: PlannedFile, done_before: int, total: int) -> int:
        """Bring the .part file up to the full size; returns the bytes fetched."""
        p.part.parent.mkdir(parents=True, exist_ok=True)
        if not _part_matches(p.part, p):  # never append to bytes of another version
            p.part.unlink(missing_ok=True)
        _sidecar(p.part).write_text(json.dumps({"size": p.size, "sha256": p.sha256, "commit": p.commit}))
        have = p.part.stat().st_size if p.part.exists() else 0
        if have > p.size:
            p.part.unlink()
            have = 0
        if have == p.size:
            return 0
        job = self
        progress_state = {"file_done": have}

        class _Bar:  # the tqdm-shaped progress sink http_get drives
            def __init__(self, *args: object, **kwargs: object) -> None:
                pass

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def update(self, n: int) -> None:
                progress_state["file_done"] += n
                job._emit(job._snapshot(p, "downloading", done_before, total, progress_state["file_done"]))
                job._raise_if_stopped()

            def close(self) -> None:
                return None

        self._raise_if_stopped()
        headers = self._headers()
        with p.part.open("ab") as f:
            try:
                http_get(p.url, f, resume_size=have, headers=headers, expected_size=p.size, tqdm_class=_Bar)
            except DownloadStopped:
                raise
            except Exception as exc:  # the partial file stays for the next run
                raise explain(exc, p.spec.what) from exc
        return p.size - have

    def _snapshot(self, p: PlannedFile, state: str, done_before: int, total: int, file_done: int) -> Progress:
        done = done_before + file_done
        speed = self._speed.add(done)
        eta = (total - done) / speed if speed > 0 else None
        return Progress(state, p.spec.filename, p.spec.role, file_done, p.size, done, total, speed, eta)

    def _emit(self, progress: Progress) -> None:
        self.progress = progress
        try:
            self.on_progress(progress)
        except DownloadStopped:
            raise
        except Exception:  # a broken progress sink must not break the download
            log.exception("progress callback failed")


# --- files on disk ----------------------------------------------------------------------------------


def _fsync(path: Path) -> None:
    """Flush a file (or a folder, for the rename in it) to disk; folders cannot be opened on Windows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _drop_stale_part(part: Path, p: PlannedFile) -> None:
    """Delete a .part of another version, under the per-file lock: another job (the GUI's, the CLI's)
    may be writing it right now: then it is left to that job."""
    if not part.exists():
        return
    lock = FileLock(str(part) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return  # another job holds it: it is that job's file, and that job replaces or completes it
    try:
        if part.is_file() and _part_matches(part, p):
            return
        part.unlink(missing_ok=True)
        _sidecar(part).unlink(missing_ok=True)
    finally:
        lock.release()


def _sidecar(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _part_matches(part: Path, p: PlannedFile) -> bool:
    """A .part file is resumed only when it belongs to the same remote file (size and hash)."""
    try:
        meta = json.loads(_sidecar(part).read_text())
    except (OSError, ValueError):
        return False
    same = meta.get("size") == p.size and meta.get("sha256") == p.sha256
    return same and (p.sha256 is not None or meta.get("commit") == p.commit)


def _record(models_dir: Path, p: PlannedFile) -> None:
    manifest.add(models_dir, str(p.final.relative_to(models_dir)), {
        "repo": p.spec.repo, "filename": p.spec.filename, "revision": p.spec.revision, "role": p.spec.role,
        "commit": p.commit, "size": p.size, "sha256": p.sha256, "source": "hub",
    })  # fmt: skip


def _installed_matches(models_dir: Path, p: PlannedFile) -> bool:
    """An installed file counts as present when the manifest recorded the same hash and size."""
    entry = manifest.read(models_dir).get(str(p.final.relative_to(models_dir)), {})
    return entry.get("size") == p.size == p.final.stat().st_size and entry.get("sha256") == p.sha256


def _gb(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def progress_dict(progress: Progress) -> dict:
    return asdict(progress)
