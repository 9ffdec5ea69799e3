"""A Hugging Face Hub stand-in on loopback, close enough for the real `huggingface_hub` client.

Files under `/{repo}/resolve/{revision}/{filename}` (HEAD, GET, one byte range) carry the hub's headers;
`/api/models/{repo}[/revision/{rev}]` and `.../tree/{rev}[/{path}]` answer as the hub does; errors come in
the hub's shape (X-Error-Code, X-Error-Message, `{"error": ...}`) so `hf_raise_for_status` raises the
same exception classes as against huggingface.co. Tests inject faults through plain attributes.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import select
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 1 << 20
TIMESTAMP = "2026-01-01T00:00:00.000Z"
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<name>.+)")
_API = re.compile(
    r"/api/models/(?P<repo>[^/]+/[^/]+)"
    r"(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<sub>/.+)?)?"
)
_RANGE = re.compile(r"bytes=(?=-?\d)(\d*)-(\d*)")  # one range: a-b, a- or -n (the last n bytes)
_LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
# An injected status, worded as the hub words it: (X-Error-Code, X-Error-Message); other statuses a 500's.
_STATUS_ERRORS: dict[int, tuple[str | None, str]] = {
    401: ("RepoNotFound", "Invalid username or password."),
    403: ("GatedRepo", "Access to model {repo} is restricted and you are not in the authorized list."),
    404: ("EntryNotFound", "Entry not found"),
    429: (None, "You have been rate-limited; you can retry this action in about 1 second."),
}
_SERVER_ERROR = (None, "Internal Error - We're working hard to fix this as soon as possible!")


def _git_oid(data: bytes) -> str:
    """The git blob id of `data`: the hub's `ETag`, `blobId` and tree `oid` of a file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class _File:
    """One served file: a file on disk (an LFS file) or bytes in memory (a plain git file)."""

    size: int
    sha256: str | None = None
    path: Path | None = None
    data: bytes = b""

    @property
    def pointer(self) -> bytes:
        return _LFS_POINTER.format(sha256=self.sha256, size=self.size).encode()

    @property
    def oid(self) -> str:
        return _git_oid(self.pointer if self.sha256 else self.data)

    def open(self) -> BinaryIO:
        return self.path.open("rb") if self.path else io.BytesIO(self.data)


@dataclass
class _Repo:
    commit: str
    files: dict[str, _File] = field(default_factory=dict)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `FakeHub.requests` instead."""

    def handle(self) -> None:
        try:
            super().handle()
        except ConnectionError:  # the client hung up mid-response: normal for downloads
            self.close_connection = True

    @property
    def head(self) -> bool:
        return self.command == "HEAD"

    def do_GET(self) -> None:
        """Route a HEAD or GET; a path the hub would not serve here is a plain 404."""
        hub = self.server.hub
        hub._log(self.command, self.path, self.headers)
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if m := _RESOLVE.fullmatch(url.path):
            repo, rev, name = (unquote(g) for g in m.group("repo", "rev", "name"))
            if isinstance(found := self._find(repo, rev, name), _File):
                self._resolve(repo, name, found)
        elif m := _API.fullmatch(url.path):
            repo = unquote(m["repo"])
            if not self._find(repo, unquote(m["rev"] or "main")):
                return
            if m["kind"] != "tree":
                return self._json(hub._model_info(repo, blobs="true" in query.get("blobs", [])))
            sub = unquote(m["sub"] or "").strip("/")
            entries = hub._tree(repo, sub, recursive="true" in query.get("recursive", []))
            if entries is None:
                return self._fail(404, "EntryNotFound", f"{sub} does not exist")
            self._json(entries)
        else:
            self._fail(404, None, "Not Found")

    do_HEAD = do_GET

    def _find(self, repo: str, rev: str, name: str | None = None) -> _Repo | _File | None:
        """The file (or without `name` the repo) a request names; None once a hub-shaped error was sent."""
        hub = self.server.hub
        auth = self.headers.get("Authorization")
        if hub.required_token is not None and auth != f"Bearer {hub.required_token}":
            if auth is None:  # the hub's answer for a private repo without a token
                return self._fail(401, "RepoNotFound", "Invalid username or password.")
            return self._fail(401, None, "Invalid credentials in Authorization header")
        if status := hub.repo_status.get(repo) or hub.fail_status.get((repo, name or "")):
            code, message = _STATUS_ERRORS.get(status, _SERVER_ERROR)
            if status == 404 and repo in hub.repo_status:
                code, message = "RepoNotFound", "Repository not found"
            return self._fail(status, code, message.format(repo=repo))
        if (found := hub._repos.get(repo)) is None:
            return self._fail(404, "RepoNotFound", "Repository not found")
        if rev not in ("main", found.commit):
            return self._fail(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if name is None:
            return found
        if name not in found.files:
            return self._fail(404, "EntryNotFound", f'{name} does not exist on "{rev}"')
        return found.files[name]

    def _resolve(self, repo: str, name: str, f: _File) -> None:
        """A file's metadata (HEAD) or body (GET, whole or one byte range), answered directly: 200/206/416."""
        hub = self.server.hub
        size = hub.declared_size.get((repo, name), f.size) if self.head else f.size
        start, end = 0, size
        asked = "" if self.head or hub.ignore_range else self.headers.get("Range", "")
        if wanted := _RANGE.fullmatch(asked):
            first, last = wanted.groups()
            start, end = (int(first), int(last or size - 1) + 1) if first else (size - int(last), size)
            start, end = max(start, 0), min(end, size)
            if start >= end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                return self.end_headers()
        self.send_response(206 if wanted else 200)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("X-Repo-Commit", hub._repos[repo].commit)
        self.send_header("ETag", f'"{f.oid}"')
        if f.sha256:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if not self.head:
            self._send_body((repo, name), f, start, end)

    def _send_body(self, key: tuple[str, str], f: _File, start: int, end: int) -> None:
        """Stream bytes [start, end) in 1 MiB chunks, applying the stall and corruption faults on the way."""
        hub = self.server.hub
        with f.open() as fh:
            fh.seek(start)
            pos = start
            while pos < end:
                stop, gate = hub._stall_point(key, pos, min(pos + CHUNK, end))
                if gate is not None:
                    hub.stalled.set()
                    self._hold(gate)
                chunk = hub._corrupt(key, pos, fh.read(stop - pos))
                hub._count(key, len(chunk))  # before the write: a client that has the bytes sees them counted
                try:
                    self.wfile.write(chunk)
                except ConnectionError:
                    hub._count(key, -len(chunk))
                    raise
                pos = stop

    def _hold(self, gate: threading.Event) -> None:
        """Wait until `gate` is set; give up as soon as the client has closed its connection."""
        while True:
            released = gate.wait(0.05)
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                raise ConnectionAbortedError("the client went away during a stall")
            if released:
                return

    def _fail(self, status: int, code: str | None, message: str) -> None:
        """An error in the hub's shape: X-Error-Code (when the hub sets one), X-Error-Message, a JSON body."""
        headers = {"X-Error-Code": code} if code else {}
        headers["X-Error-Message"] = message
        if status == 429:
            headers["Retry-After"] = "1"
        self._json({"error": message}, status, headers)

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not self.head:
            self.wfile.write(body)


class FakeHub:
    """The server, its files, counters and faults; a context manager, or `start()`/`stop()`.

    Faults, keyed by `(repo, filename)` unless said: `fail_status`, `repo_status` (by repo) answer with a
    status in the hub's error shape; `required_token` needs `Authorization: Bearer <token>` on every route;
    `declared_size` lies in HEAD, model_info and the tree; `corrupt_once` flips the byte at an offset in the
    next GET that sends it; `ignore_range` answers 200 with the whole file even when a Range is asked for.
    """

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.Lock()
        self._sent: dict[tuple[str, str], int] = {}
        self._stalls: dict[tuple[str, str], tuple[int, threading.Event]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.fail_status: dict[tuple[str, str], int] = {}
        self.repo_status: dict[str, int] = {}
        self.required_token: str | None = None
        self.declared_size: dict[tuple[str, str], int] = {}
        self.corrupt_once: dict[tuple[str, str], int] = {}
        self.ignore_range = False
        self.stalled = threading.Event()  # set when a GET reaches the offset given to `stall_after`

    def add_file(
        self, repo: str, filename: str, path: Path, sha256: str | None = None, revision_sha: str | None = None
    ) -> None:
        """Serve the file at `path` as an LFS file; its sha256 is hashed here (streamed) unless given."""
        if sha256 is None:
            digest = hashlib.sha256()
            with path.open("rb") as fh:
                while block := fh.read(CHUNK):
                    digest.update(block)
            sha256 = digest.hexdigest()
        self._repo(repo, revision_sha).files[filename] = _File(path.stat().st_size, sha256, path)

    def add_bytes(self, repo: str, filename: str, data: bytes) -> None:
        """Serve `data` as a plain (non-LFS) git file: no X-Linked-* headers, the ETag is its git blob id."""
        self._repo(repo).files[filename] = _File(len(data), data=data)

    def _repo(self, repo: str, revision_sha: str | None = None) -> _Repo:
        found = self._repos.setdefault(repo, _Repo(hashlib.sha1(f"fake-hub:{repo}".encode()).hexdigest()))
        found.commit = revision_sha or found.commit
        return found

    def start(self) -> FakeHub:
        self._server = _Server(self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def bytes_sent(self, repo: str, filename: str) -> int:
        """Body bytes sent by every GET of the file (whole or ranged) since the last `reset_counters()`."""
        with self._lock:
            return self._sent.get((repo, filename), 0)

    def reset_counters(self) -> None:
        with self._lock:
            self._sent.clear()
            self.requests.clear()

    def stall_after(self, repo: str, filename: str, n_bytes: int) -> threading.Event:
        """Hold the next GET that reaches offset `n_bytes` (all before it sent) until the returned event is
        set or the client disconnects; `self.stalled` is set when the hold begins."""
        gate = threading.Event()
        with self._lock:
            self._stalls[repo, filename] = (n_bytes, gate)
            self.stalled.clear()
        return gate

    def _log(self, method: str, path: str, headers: Any) -> None:
        picked = {name: headers[name] for name in ("Range", "Authorization") if name in headers}
        with self._lock:
            self.requests.append((method, path, picked))

    def _count(self, key: tuple[str, str], n: int) -> None:
        with self._lock:
            self._sent[key] = self._sent.get(key, 0) + n

    def _stall_point(self, key: tuple[str, str], pos: int, stop: int) -> tuple[int, threading.Event | None]:
        """Where the chunk [pos, stop) must end, and the gate to wait at first when the stall is at `pos`."""
        with self._lock:
            at, gate = self._stalls.get(key, (-1, None))
            if gate is None or not pos <= at < stop:
                return stop, None
            if at > pos:
                return at, None
            del self._stalls[key]
            return stop, gate

    def _corrupt(self, key: tuple[str, str], pos: int, chunk: bytes) -> bytes:
        with self._lock:
            at = self.corrupt_once.get(key)
            if at is None or not pos <= at < pos + len(chunk):
                return chunk
            del self.corrupt_once[key]
        flipped = bytearray(chunk)
        flipped[at - pos] ^= 0xFF
        return bytes(flipped)

    def _lfs(self, repo: str, name: str, f: _File) -> tuple[int, dict[str, Any] | None]:
        """The size to report (`declared_size` or true) and the LFS info of a file (None if not LFS)."""
        size = self.declared_size.get((repo, name), f.size)
        return size, {"sha256": f.sha256, "size": size, "pointerSize": len(f.pointer)} if f.sha256 else None

    def _model_info(self, repo: str, blobs: bool) -> dict[str, Any]:
        """`GET /api/models/{repo}` as the hub answers it; sizes, blob ids and LFS data only with `blobs`."""
        found = self._repos[repo]
        siblings = []
        for name, f in sorted(found.files.items()):
            size, lfs = self._lfs(repo, name, f)
            extra = {"size": size, "blobId": f.oid} | ({"lfs": lfs} if lfs else {})
            siblings.append({"rfilename": name} | (extra if blobs else {}))
        return {
            "_id": hashlib.sha1(repo.encode()).hexdigest()[:24], "id": repo, "modelId": repo,
            "author": repo.split("/")[0], "sha": found.commit, "private": False, "gated": False,
            "disabled": False, "downloads": 0, "likes": 0, "tags": ["gguf"], "siblings": siblings,
            "lastModified": TIMESTAMP, "createdAt": TIMESTAMP,
        }  # fmt: skip

    def _tree(self, repo: str, sub: str, recursive: bool) -> list[dict[str, Any]] | None:
        """`GET /api/models/{repo}/tree/{rev}/{sub}`: the entries under `sub`, None if there are none."""
        prefix = f"{sub}/" if sub else ""
        entries: dict[str, dict[str, Any]] = {}
        for name, f in sorted(self._repos[repo].files.items()):
            if not name.startswith(prefix):
                continue
            parts = name[len(prefix) :].split("/")
            for i in range(1, len(parts) if recursive else min(len(parts), 2)):
                folder = prefix + "/".join(parts[:i])
                entries[folder] = {"type": "directory", "oid": _git_oid(folder.encode()), "path": folder}
            if recursive or len(parts) == 1:
                size, lfs = self._lfs(repo, name, f)
                entries[name] = {"type": "file", "oid": f.oid, "size": size, "path": name}
                if lfs:  # the tree calls the sha256 `oid`
                    entries[name]["lfs"] = {"oid": lfs.pop("sha256"), **lfs}
        return list(entries.values()) if entries or not sub else None
