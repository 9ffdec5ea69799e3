"""Downloads against a Hugging Face-compatible file server on loopback, with the real huggingface_hub client.

The server (tests/support/fake_hub.py) serves the two real test GGUF files with the hub's headers and LFS
hashes; the tests kill, corrupt, refuse and rate-limit through it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.catalog import download, gguf, manifest, pairing, remote
from app.catalog.digests import sha256_file
from app.catalog.packaged import GEMMA_270M, QWEN_CODER_1_5B
from tests.support.fake_hub import FakeHub

QWEN_REPO, QWEN_FILE = "test-org/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
GEMMA_REPO, GEMMA_FILE = "test-org/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf"
GEMMA = (GEMMA_REPO, GEMMA_FILE)
TOKEN = "hf_testTOKEN0123456789abcdef"


@pytest.fixture(scope="module")
def fake_hub(gemma_path: Path, qwen_path: Path) -> Iterator[FakeHub]:
    server = FakeHub()
    server.add_file(QWEN_REPO, QWEN_FILE, qwen_path, sha256=QWEN_CODER_1_5B.sha256)
    server.add_file(GEMMA_REPO, GEMMA_FILE, gemma_path, sha256=GEMMA_270M.sha256)
    server.add_bytes(GEMMA_REPO, "README.md", b"# gemma test repo\n")
    with server:
        yield server


@pytest.fixture
def hubsrv(fake_hub: FakeHub) -> Iterator[FakeHub]:
    """The module's server with counters reset and no faults left over from another test."""
    fake_hub.reset_counters()
    yield fake_hub
    fake_hub.fail_status.clear()
    fake_hub.repo_status.clear()
    fake_hub.declared_size.clear()
    fake_hub.corrupt_once.clear()
    fake_hub.required_token = None


def _job(server: FakeHub, models: Path, files: list[download.FileSpec], **kw) -> download.DownloadJob:
    return download.DownloadJob(files, models, endpoint=server.url, **kw)


def _gemma_spec(role: str = "target") -> download.FileSpec:
    return download.FileSpec(GEMMA_REPO, GEMMA_FILE, role)


def _cli_env(server: FakeHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return env | {
        "HF_ENDPOINT": server.url,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "FORESIGHT_MODELS__DIR": str(tmp_path / "models"),
        **extra,
    }


def test_a_pair_downloads_as_one_job_and_verifies(hubsrv: FakeHub, tmp_path: Path) -> None:
    events: list[download.Progress] = []
    files = [download.FileSpec(QWEN_REPO, QWEN_FILE, "target"), _gemma_spec("drafter")]
    result = _job(hubsrv, tmp_path / "models", files, on_progress=events.append).run()
    assert [p.name for p in result.paths] == [QWEN_FILE, GEMMA_FILE]
    assert sha256_file(result.paths[0]) == QWEN_CODER_1_5B.sha256
    assert sha256_file(result.paths[1]) == GEMMA_270M.sha256
    assert result.bytes_downloaded == QWEN_CODER_1_5B.size + GEMMA_270M.size
    assert result.bytes_resumed == 0
    assert not list((tmp_path / "models" / download.PARTIAL_DIR).rglob("*.part"))
    records = manifest.read(tmp_path / "models")
    assert {e["role"] for e in records.values()} == {"target", "drafter"}
    # one progress stream for the whole pair: its done bytes never go back, and it ends done
    done = [e.done for e in events if e.state == "downloading"]
    assert done == sorted(done)
    assert events[-1].state == "done"
    assert {e.role for e in events if e.state == "downloading"} == {"target", "drafter"}
    assert all(e.total == QWEN_CODER_1_5B.size + GEMMA_270M.size for e in events if e.state == "downloading")
    # a second run finds everything installed and fetches nothing
    hubsrv.reset_counters()
    again = _job(hubsrv, tmp_path / "models", files).run()
    assert again.bytes_downloaded == 0
    assert hubsrv.bytes_sent(*GEMMA) == 0


def test_a_killed_download_resumes_where_it_stopped(hubsrv: FakeHub, tmp_path: Path) -> None:
    stall_at = 100 << 20
    release = hubsrv.stall_after(GEMMA_REPO, GEMMA_FILE, stall_at)
    env = _cli_env(hubsrv, tmp_path)
    cmd = [sys.executable, "-m", "app", "models", "pull", f"hf://{GEMMA_REPO}/{GEMMA_FILE}", "--json"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert hubsrv.stalled.wait(60), "the download never reached the stall point"
        partial = tmp_path / "models" / download.PARTIAL_DIR
        part = download.library_path(partial, GEMMA_REPO, GEMMA_FILE + ".part")
        deadline = time.monotonic() + 20
        while (not part.exists() or part.stat().st_size < stall_at) and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        release.set()
        if first.poll() is None:
            first.kill()
    kept = part.stat().st_size
    assert kept == stall_at  # everything received before the kill is on disk
    final = download.library_path(tmp_path / "models", GEMMA_REPO, GEMMA_FILE)
    assert not final.exists()  # a partial file is never at the model's path

    hubsrv.reset_counters()
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout.strip().splitlines()[-1])["result"]
    assert result["bytes_resumed"] == kept
    assert result["bytes_downloaded"] == GEMMA_270M.size - kept
    assert hubsrv.bytes_sent(*GEMMA) == GEMMA_270M.size - kept  # the server agrees: nothing re-sent
    assert sha256_file(final) == GEMMA_270M.sha256
    assert not part.exists()


def test_a_corrupted_byte_is_detected_and_the_file_fetched_again(hubsrv: FakeHub, tmp_path: Path) -> None:
    hubsrv.corrupt_once[GEMMA] = 123_456_789
    result = _job(hubsrv, tmp_path / "models", [_gemma_spec()]).run()
    assert result.refetched == [f"{GEMMA_REPO}/{GEMMA_FILE}"]
    assert result.bytes_downloaded == 2 * GEMMA_270M.size
    assert sha256_file(result.paths[0]) == GEMMA_270M.sha256


def test_a_download_larger_than_the_free_space_is_refused_before_starting(
    hubsrv: FakeHub, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    hubsrv.declared_size[GEMMA] = shutil.disk_usage(models).free + (1 << 30)
    with pytest.raises(download.NotEnoughSpace, match="not enough disk space"):
        _job(hubsrv, models, [_gemma_spec()]).run()
    assert hubsrv.bytes_sent(*GEMMA) == 0
    assert not list(models.rglob("*.part"))


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (401, "(401)"),
        (403, "accept its licence"),
        (429, "rate-limiting"),
        (404, "(404)"),
    ],
)
def test_hub_errors_are_explained(hubsrv: FakeHub, tmp_path: Path, status: int, words: str) -> None:
    hubsrv.fail_status[GEMMA] = status
    with pytest.raises(download.HubError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        _job(hubsrv, tmp_path / "models", [_gemma_spec()]).run()
    assert info.value.status == status


def test_an_unknown_repo_is_explained(hubsrv: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(download.HubError, match=r"does not exist|not found"):
        _job(hubsrv, tmp_path / "models", [download.FileSpec("nobody/nothing", "x.gguf")]).run()


def test_pause_keeps_the_partial_file_and_the_next_run_resumes(hubsrv: FakeHub, tmp_path: Path) -> None:
    job: download.DownloadJob

    def pause_midway(p: download.Progress) -> None:
        if p.state == "downloading" and p.file_done >= 60 << 20:
            job.pause()

    job = _job(hubsrv, tmp_path / "models", [_gemma_spec()], on_progress=pause_midway)
    with pytest.raises(download.DownloadStopped) as stopped:
        job.run()
    assert stopped.value.paused
    assert job.progress.state == "paused"
    part = download.library_path(tmp_path / "models" / download.PARTIAL_DIR, GEMMA_REPO, GEMMA_FILE + ".part")
    kept = part.stat().st_size
    # http_get reports a chunk before writing it, so the chunk in hand when the pause lands is dropped
    assert 40 << 20 <= kept < GEMMA_270M.size
    result = _job(hubsrv, tmp_path / "models", [_gemma_spec()]).run()
    assert result.bytes_resumed == kept
    assert result.bytes_downloaded == GEMMA_270M.size - kept
    assert sha256_file(result.paths[0]) == GEMMA_270M.sha256


def test_cancel_removes_the_partial_file(hubsrv: FakeHub, tmp_path: Path) -> None:
    job: download.DownloadJob

    def cancel_midway(p: download.Progress) -> None:
        if p.state == "downloading" and p.file_done >= 30 << 20:
            job.cancel()

    job = _job(hubsrv, tmp_path / "models", [_gemma_spec()], on_progress=cancel_midway)
    with pytest.raises(download.DownloadStopped) as stopped:
        job.run()
    assert not stopped.value.paused
    assert job.progress.state == "cancelled"
    assert not list((tmp_path / "models").rglob("*.part"))
    assert not list((tmp_path / "models").rglob("*.gguf"))


def test_the_token_is_sent_and_never_logged(
    hubsrv: FakeHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hubsrv.required_token = TOKEN
    with pytest.raises(download.HubError, match="401"):
        _job(hubsrv, tmp_path / "models", [_gemma_spec()]).run()
    caplog.set_level(logging.DEBUG)
    result = _job(hubsrv, tmp_path / "models", [_gemma_spec()], token=TOKEN).run()
    assert sha256_file(result.paths[0]) == GEMMA_270M.sha256
    assert any(h.get("Authorization") == f"Bearer {TOKEN}" for _, _, h in hubsrv.requests)
    assert TOKEN not in caplog.text

    # the command line, at DEBUG, with the token from the environment: not in its output nor its log file
    home = tmp_path / "home"
    env = _cli_env(hubsrv, tmp_path, HF_TOKEN=TOKEN, FORESIGHT_HOME=str(home))
    env["FORESIGHT_MODELS__DIR"] = str(tmp_path / "models2")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "--log-level",
            "DEBUG",
            "models",
            "pull",
            f"hf://{GEMMA_REPO}/{GEMMA_FILE}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    logs = "".join(p.read_text() for p in home.rglob("*.log"))
    assert logs, "the debug log was written"
    assert TOKEN not in out.stdout + out.stderr + logs


def test_remote_pairing_reads_under_five_percent_of_each_file(
    hubsrv: FakeHub, gemma_path: Path, qwen_path: Path
) -> None:
    got = {}
    for repo, name, path in ((QWEN_REPO, QWEN_FILE, qwen_path), (GEMMA_REPO, GEMMA_FILE, gemma_path)):
        header = remote.read_remote_header(
            f"hf://{repo}/{name}", client=None, token=None, endpoint=hubsrv.url
        )
        sent = hubsrv.bytes_sent(repo, name)
        size = path.stat().st_size
        assert header.bytes_fetched == sent
        assert sent < 0.05 * size, f"{name}: read {sent:,} of {size:,} bytes"
        assert header.header.metadata == gguf.read_file(path).metadata
        got[name] = header.header
    remote_verdict = pairing.check_pair(got[QWEN_FILE], got[GEMMA_FILE])
    local_verdict = pairing.check_pair(gguf.read_file(qwen_path), gguf.read_file(gemma_path))
    assert remote_verdict.as_dict() == local_verdict.as_dict()
    assert not remote_verdict.compatible


def test_models_pair_command_on_hub_references(hubsrv: FakeHub, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "app", "models", "pair", f"hf://{GEMMA_REPO}/{GEMMA_FILE}",
         f"hf://{GEMMA_REPO}/{GEMMA_FILE}", "--json"],
        env=_cli_env(hubsrv, tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert verdict["compatible"] is True
    stats = verdict["remote"]["target"]
    assert stats["bytes_read"] < 0.05 * stats["file_size"]


def test_a_partial_file_of_another_version_is_not_resumed(hubsrv: FakeHub, tmp_path: Path) -> None:
    models = tmp_path / "models"
    part = download.library_path(models / download.PARTIAL_DIR, GEMMA_REPO, GEMMA_FILE + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\x00" * (8 << 20))  # bytes of a file the hub no longer serves
    part.with_name(part.name + ".json").write_text(json.dumps({"size": 1, "sha256": "0" * 64, "commit": "x"}))
    result = _job(hubsrv, models, [_gemma_spec()]).run()
    assert result.bytes_resumed == 0
    assert result.refetched == []  # started over cleanly rather than appending and failing the hash
    assert sha256_file(result.paths[0]) == GEMMA_270M.sha256


def test_the_same_job_resumes_after_a_pause(hubsrv: FakeHub, tmp_path: Path) -> None:
    job: download.DownloadJob
    paused = []

    def pause_once(p: download.Progress) -> None:
        if p.state == "downloading" and p.file_done >= 30 << 20 and not paused:
            paused.append(p.file_done)
            job.pause()

    job = _job(hubsrv, tmp_path / "models", [_gemma_spec()], on_progress=pause_once)
    with pytest.raises(download.DownloadStopped):
        job.run()
    result = job.run()  # the GUI's resume button calls run() again on the same job
    assert result.bytes_resumed > 0
    assert sha256_file(result.paths[0]) == GEMMA_270M.sha256


def test_a_file_installed_before_a_crash_is_recorded_not_fetched_again(
    hubsrv: FakeHub, tmp_path: Path, gemma_path: Path
) -> None:
    models = tmp_path / "models"
    final = download.library_path(models, GEMMA_REPO, GEMMA_FILE)
    final.parent.mkdir(parents=True)
    os.link(gemma_path, final)  # renamed into place, then the process died before the manifest write
    result = _job(hubsrv, models, [_gemma_spec()]).run()
    assert result.bytes_downloaded == 0
    assert hubsrv.bytes_sent(*GEMMA) == 0
    assert manifest.read(models)[f"{GEMMA_REPO}/{GEMMA_FILE}"]["sha256"] == GEMMA_270M.sha256


def test_an_unreadable_manifest_is_set_aside_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / manifest.MANIFEST).write_text("{ half a manifest")
    assert manifest.read(tmp_path) == {}
    (aside,) = tmp_path.glob(f"{manifest.MANIFEST}.bad-*")
    assert aside.read_text() == "{ half a manifest"


@pytest.mark.parametrize(
    ("repo", "filename"),
    [("a/b", "../../etc/x.gguf"), ("a/b", "c:\\x.gguf"), ("a/b/c", "x.gguf"), ("..", "x")],
)
def test_hub_names_cannot_leave_the_models_folder(tmp_path: Path, repo: str, filename: str) -> None:
    with pytest.raises(ValueError, match="unsafe"):
        download.library_path(tmp_path, repo, filename)


def test_a_server_that_ignores_range_is_refused_before_the_weights(hubsrv: FakeHub) -> None:
    hubsrv.ignore_range = True
    try:
        with pytest.raises(remote.RemoteError, match="does not answer HTTP Range"):
            remote.read_remote_header(f"hf://{GEMMA_REPO}/{GEMMA_FILE}", endpoint=hubsrv.url)
    finally:
        hubsrv.ignore_range = False
    assert hubsrv.bytes_sent(*GEMMA) < GEMMA_270M.size // 10  # the body was not read on


def test_a_stale_part_held_by_another_job_is_left_to_it(hubsrv: FakeHub, tmp_path: Path) -> None:
    from filelock import FileLock

    models = tmp_path / "models"
    part = download.library_path(models / download.PARTIAL_DIR, GEMMA_REPO, GEMMA_FILE + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"bytes of a download in another process, its record not yet written")
    job = _job(hubsrv, models, [_gemma_spec()])
    with FileLock(str(part) + ".lock"):  # held as a running download holds it
        job.plan()
        assert part.exists()
    job.plan()  # nobody holds it now: a part without a matching record is stale
    assert not part.exists()
