"""The fake hub (tests/support/fake_hub.py) against the real huggingface_hub client, on small temporary files.

Every client call names the fake hub's endpoint and `token=False` (or the test token), and the
environment points HF_HOME at a temporary folder: nothing reaches huggingface.co or the user's token.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.support.fake_hub import FakeHub

REPO, FILE, README, NESTED = "test-org/tiny-GGUF", "tiny-q4_k_m.gguf", "README.md", "extra/deep/part.bin"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
README_TEXT = b"# tiny test repo\n"
TOKEN = "hf_fakeHubTestToken0123456789"


@pytest.fixture(scope="module")
def blob() -> bytes:
    return os.urandom(300_000)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, blob: bytes) -> Iterator[FakeHub]:
    path = tmp_path_factory.mktemp("fake-hub") / FILE
    path.write_bytes(blob)
    with FakeHub() as server:
        server.add_file(REPO, FILE, path, revision_sha=COMMIT)
        server.add_file(REPO, NESTED, path, sha256=hashlib.sha256(blob).hexdigest())
        server.add_bytes(REPO, README, README_TEXT)
        yield server


@pytest.fixture
def hub(served: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The module's server with counters reset and no fault left over; the client kept off the network."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read at import time
    served.reset_counters()
    yield served
    for faults in (served.fail_status, served.repo_status, served.declared_size, served.corrupt_once):
        faults.clear()
    served.required_token, served.ignore_range = None, False


def _url(hub: FakeHub, name: str = FILE, repo: str = REPO, revision: str | None = None) -> str:
    return hf_hub_url(repo, name, revision=revision, endpoint=hub.url)


def _metadata(hub: FakeHub, name: str = FILE, repo: str = REPO, token: str | bool = False, **kw):
    return get_hf_file_metadata(_url(hub, name, repo, **kw), token=token, endpoint=hub.url)


def test_file_metadata_has_the_lfs_size_sha256_and_commit(hub: FakeHub, blob: bytes) -> None:
    meta = _metadata(hub)
    assert (meta.size, meta.etag, meta.commit_hash) == (len(blob), hashlib.sha256(blob).hexdigest(), COMMIT)
    assert meta.location == _url(hub)  # answered directly, no redirect
    assert _metadata(hub, revision=COMMIT).etag == meta.etag
    plain = _metadata(hub, README)  # a non-LFS file: its git blob id, not a sha256
    assert plain.etag == hashlib.sha1(b"blob %d\0" % len(README_TEXT) + README_TEXT).hexdigest()
    assert plain.size == len(README_TEXT)
    hub.declared_size[REPO, FILE] = 1 << 40
    assert _metadata(hub).size == 1 << 40
    assert hub.bytes_sent(REPO, FILE) == 0  # HEAD sends no body


def test_model_info_and_tree_list_the_files(hub: FakeHub, blob: bytes) -> None:
    api = HfApi(endpoint=hub.url, token=False)
    info = api.model_info(REPO, files_metadata=True)
    assert info.sha == COMMIT
    siblings = {s.rfilename: s for s in info.siblings or []}
    assert set(siblings) == {FILE, NESTED, README}
    lfs = siblings[FILE].lfs
    assert lfs is not None
    assert (lfs.sha256, lfs.size) == (hashlib.sha256(blob).hexdigest(), len(blob))
    assert siblings[FILE].size == len(blob)
    assert siblings[README].lfs is None
    assert all(s.size is None for s in api.model_info(REPO, revision=COMMIT).siblings or [])
    top = {e.path: type(e).__name__ for e in api.list_repo_tree(REPO)}
    assert top == {FILE: "RepoFile", README: "RepoFile", "extra": "RepoFolder"}
    deep = [e.path for e in api.list_repo_tree(REPO, path_in_repo="extra", recursive=True)]
    assert deep == ["extra/deep", NESTED]


def test_hf_hub_download_fetches_the_file(hub: FakeHub, blob: bytes, tmp_path: Path) -> None:
    path = hf_hub_download(REPO, FILE, cache_dir=tmp_path / "cache", token=False, endpoint=hub.url)
    assert Path(path).read_bytes() == blob
    assert hub.bytes_sent(REPO, FILE) == len(blob)


def test_ranges(hub: FakeHub, blob: bytes) -> None:
    size = len(blob)
    with httpx.Client() as client:
        part = client.get(_url(hub), headers={"Range": "bytes=100-199"})
        assert part.status_code == 206
        assert part.headers["Content-Range"] == f"bytes 100-199/{size}"
        assert part.content == blob[100:200]
        assert client.get(_url(hub), headers={"Range": "bytes=-10"}).content == blob[-10:]
        assert client.get(_url(hub), headers={"Range": f"bytes={size - 5}-"}).content == blob[-5:]
        past = client.get(_url(hub), headers={"Range": f"bytes={size}-"})
        assert (past.status_code, past.headers["Content-Range"]) == (416, f"bytes */{size}")
        assert hub.bytes_sent(REPO, FILE) == 100 + 10 + 5
        hub.ignore_range = True
        whole = client.get(_url(hub), headers={"Range": "bytes=100-199"})
        assert (whole.status_code, whole.content) == (200, blob)
    assert hub.bytes_sent(REPO, FILE) == 115 + size
    assert hub.requests[0] == ("GET", f"/{REPO}/resolve/main/{FILE}", {"Range": "bytes=100-199"})
    hub.reset_counters()
    assert (hub.bytes_sent(REPO, FILE), hub.requests) == (0, [])


@pytest.mark.parametrize(
    ("repo", "name", "error"),
    [(REPO, "missing.gguf", EntryNotFoundError), ("nobody/nothing", FILE, RepositoryNotFoundError)],
)
def test_missing_things_raise_the_hubs_errors(hub: FakeHub, repo: str, name: str, error: type) -> None:
    with pytest.raises(error) as info:
        _metadata(hub, name, repo)
    assert not isinstance(info.value, GatedRepoError)
    with pytest.raises(RevisionNotFoundError):
        _metadata(hub, revision="no-such-branch")
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url, token=False).model_info("nobody/nothing")


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, RepositoryNotFoundError), (403, GatedRepoError), (429, HfHubHTTPError), (500, HfHubHTTPError)],
)
def test_injected_statuses(hub: FakeHub, status: int, error: type[HfHubHTTPError]) -> None:
    hub.fail_status[REPO, FILE] = status
    with pytest.raises(HfHubHTTPError) as info:
        _metadata(hub)
    assert type(info.value) is error
    assert info.value.response.status_code == status
    if status == 429:
        assert info.value.response.headers["Retry-After"] == "1"
    with httpx.Client() as client:
        got = client.get(_url(hub))
    assert got.status_code == status
    assert got.json()["error"] == got.headers["X-Error-Message"]
    assert _metadata(hub, README).size == len(README_TEXT)  # only that file fails
    hub.repo_status[REPO] = status
    with pytest.raises(error):
        HfApi(endpoint=hub.url, token=False).model_info(REPO)


def test_required_token(hub: FakeHub) -> None:
    hub.required_token = TOKEN
    with pytest.raises(RepositoryNotFoundError) as missing:
        _metadata(hub)
    assert missing.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError, match="Invalid credentials") as wrong:
        _metadata(hub, token="hf_wrong")
    assert wrong.value.response.status_code == 401
    assert _metadata(hub, token=TOKEN).size
    assert HfApi(endpoint=hub.url, token=TOKEN).model_info(REPO).sha == COMMIT
    assert hub.requests[-1][2] == {"Authorization": f"Bearer {TOKEN}"}


def test_stall_holds_the_body_until_released(hub: FakeHub, blob: bytes) -> None:
    release = hub.stall_after(REPO, FILE, 123_456)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(httpx.get(_url(hub), timeout=30).content))
    reader.start()
    assert hub.stalled.wait(10)
    reader.join(0.3)
    assert reader.is_alive()
    assert hub.bytes_sent(REPO, FILE) == 123_456
    release.set()
    reader.join(10)
    assert got == [blob]
    assert hub.bytes_sent(REPO, FILE) == len(blob)


def test_a_client_that_leaves_during_a_stall_is_let_go(hub: FakeHub, blob: bytes) -> None:
    release = hub.stall_after(REPO, FILE, 1000)
    with httpx.Client() as client, client.stream("GET", _url(hub)) as response:
        first = next(response.iter_raw())
        assert hub.stalled.wait(10)
    assert first == blob[: len(first)]
    assert hub.bytes_sent(REPO, FILE) == 1000
    release.set()  # the stall was used up: the next download runs through
    assert httpx.get(_url(hub)).content == blob
    assert hub.bytes_sent(REPO, FILE) == 1000 + len(blob)


def test_corrupt_once_flips_one_byte_once(hub: FakeHub, blob: bytes) -> None:
    hub.corrupt_once[REPO, FILE] = 200_000
    with httpx.Client() as client:
        assert client.get(_url(hub), headers={"Range": "bytes=0-99"}).content == blob[:100]  # not covered
        bad = client.get(_url(hub)).content
        assert client.get(_url(hub)).content == blob
    assert [i for i, (a, b) in enumerate(zip(bad, blob, strict=True)) if a != b] == [200_000]
    assert hub.corrupt_once == {}
