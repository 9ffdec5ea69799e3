"""GGUF headers of files on a Hugging Face hub, read with HTTP Range requests (never the weights).

A reference is `hf://owner/repo/path/in/repo.gguf` (optionally `@revision` after the repo:
`hf://owner/repo@main/file.gguf`). The endpoint is huggingface_hub's (`HF_ENDPOINT` honoured), and so
are its headers and token handling.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import httpx
from huggingface_hub import constants, hf_hub_url
from huggingface_hub.utils import build_hf_headers

from app.catalog import gguf

SCHEME = "hf://"
_FIRST_READ = 256 << 10  # then each read doubles (gguf._Reader), so a 6 MB tokenizer costs ~5 requests


class RemoteError(RuntimeError):
    """A remote file could not be read (network, HTTP status, not found); the message says which."""


@dataclass(frozen=True)
class HubFile:
    repo: str
    filename: str
    revision: str = "main"

    @classmethod
    def parse(cls, ref: str) -> HubFile:
        """`hf://owner/repo[@rev]/path/file.gguf` -> HubFile; ValueError when malformed."""
        if not ref.startswith(SCHEME):
            raise ValueError(f"not a hub reference (expected {SCHEME}owner/repo/file.gguf): {ref!r}")
        parts = ref[len(SCHEME) :].split("/")
        if len(parts) < 3 or not all(parts):
            raise ValueError(f"a hub reference needs owner, repo and file: {ref!r}")
        name, _, revision = parts[1].partition("@")
        return cls(f"{parts[0]}/{name}", "/".join(parts[2:]), revision or "main")

    def url(self, endpoint: str | None = None) -> str:
        return hf_hub_url(self.repo, self.filename, revision=self.revision, endpoint=endpoint)

    def __str__(self) -> str:
        rev = "" if self.revision == "main" else f"@{self.revision}"
        owner, name = self.repo.split("/", 1)
        return f"{SCHEME}{owner}/{name}{rev}/{self.filename}"


def status_message(status: int, what: str) -> str:
    """What an HTTP status from the hub means for the user, in words."""
    if status == 401:
        return (
            f"{what}: the hub wants a token (401). Sign in with a Hugging Face token that can read this repo."
        )
    if status == 403:
        return (
            f"{what}: access refused (403). The repo is gated or private: accept its licence on the "
            "model page with your account, and use a token with read access."
        )
    if status == 404:
        return f"{what}: not found (404). Check the repo id, the file name and the revision."
    if status == 429:
        return f"{what}: the hub is rate-limiting this machine (429). Wait a few minutes and try again."
    if status >= 500:
        return f"{what}: the hub had a server error ({status}). Try again later."
    return f"{what}: HTTP {status}"


class RangeReader(io.RawIOBase):
    """A read-only, forward-reading file over HTTP Range requests; counts the bytes fetched."""

    def __init__(self, client: httpx.Client, url: str, headers: dict[str, str], what: str) -> None:
        super().__init__()
        self._client, self._url, self._headers, self._what = client, url, headers, what
        self._pos = 0
        self.size: int | None = None
        self.bytes_fetched = 0
        self.requests = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise ValueError("RangeReader reads bounded amounts only")
        want = n
        if self.size is not None:
            want = min(want, self.size - self._pos)
            if want <= 0:
                return b""
        headers = {**self._headers, "Range": f"bytes={self._pos}-{self._pos + want - 1}"}
        try:
            with self._client.stream("GET", self._url, headers=headers) as response:
                self.requests += 1
                if response.status_code == 416:  # past the end: the file is shorter than its header says
                    return b""
                if response.status_code == 200:
                    # the server ignored Range: reading on would download the weights, so stop here
                    raise RemoteError(f"{self._what}: the server does not answer HTTP Range requests")
                if response.status_code != 206:
                    raise RemoteError(status_message(response.status_code, self._what))
                data = response.read()
        except httpx.HTTPError as exc:
            raise RemoteError(f"{self._what}: cannot reach the hub ({exc})") from exc
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if total.isdigit():
            self.size = int(total)
        self.bytes_fetched += len(data)
        self._pos += len(data)
        return data


@dataclass
class RemoteHeader:
    header: gguf.GGUFHeader
    size: int | None
    bytes_fetched: int
    requests: int


def read_remote_header(
    ref: str | HubFile,
    token: str | None = None,
    client: httpx.Client | None = None,
    endpoint: str | None = None,
) -> RemoteHeader:
    """Read a GGUF header from the hub with Range requests; raises RemoteError or gguf.GGUFError."""
    hub_file = HubFile.parse(ref) if isinstance(ref, str) else ref
    own = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
    try:
        headers = build_hf_headers(token=token, library_name="foresight")
        headers["Accept-Encoding"] = "identity"
        reader = RangeReader(client, hub_file.url(endpoint), headers, str(hub_file))
        header = gguf.read_header(reader, None, first_read=_FIRST_READ)
        header.file_size = reader.size
        header.check_complete()
        return RemoteHeader(header, reader.size, reader.bytes_fetched, reader.requests)
    finally:
        if own:
            client.close()
