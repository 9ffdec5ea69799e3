"""The model library panel (offscreen): the catalog with fit badges, the local files, downloads from a
Hugging Face stand-in on loopback, and loading a pair into a real engine subprocess (gemma-3-270m)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHeaderView
from pytestqt.qtbot import QtBot

from app.catalog import curated, download, manifest
from app.catalog.packaged import GEMMA_270M
from app.cli.models import _fit_for_machine
from app.services.client import EngineClient
from app.services.engine import EngineProcess
from app.ui.library.pair_picker import NGRAM
from app.ui.library.panel import LibraryPanel
from tests.support.fake_hub import FakeHub

SCAN_MS = 120_000
DOWNLOAD_MS = 120_000
ENGINE_MS = 120_000
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
PAIR_REPOS = {
    "gemma-test": ("test-org/gemma-3-270m-GGUF", "test-org/gemma-drafter-GGUF"),
    "gemma-other": ("test-org/gemma-other-GGUF", "test-org/gemma-drafter-GGUF"),
}
PAIR_TOML = """
[[pair]]
id = "{id}"
name = "Gemma 3 270M ({id})"
architecture = "gemma3"
license = "gemma"
context_length = 32768
verified = true
"""
MODEL_TOML = """
[pair.{role}]
repo = "{repo}"
files = ["{file}"]
size = {size}
size_exact = true
sha256 = "{sha}"
layers = 18
kv_heads = 1
head_dim = 256
"""


@pytest.fixture(scope="module")
def fake_hub(gemma_path: Path) -> Iterator[FakeHub]:
    server = FakeHub()
    for repo in {r for pair in PAIR_REPOS.values() for r in pair}:
        server.add_file(repo, GEMMA_FILE, gemma_path, sha256=GEMMA_270M.sha256)
    with server:
        yield server


@pytest.fixture
def catalog_file(tmp_path: Path) -> Path:
    file = {"file": GEMMA_FILE, "size": GEMMA_270M.size, "sha": GEMMA_270M.sha256}
    entries = []
    for pair_id, (target, drafter) in PAIR_REPOS.items():
        entries.append(PAIR_TOML.format(id=pair_id))
        entries += [
            MODEL_TOML.format(role=role, repo=repo, **file)
            for role, repo in (("target", target), ("drafter", drafter))
        ]
    path = tmp_path / "pairs.toml"
    path.write_text("schema = 1\n" + "".join(entries))
    return path


def _panel(qtbot: QtBot, models: Path, **kw) -> LibraryPanel:
    panel = LibraryPanel(EngineClient(), models, include_hf_cache=False, **kw)
    qtbot.addWidget(panel)
    panel.show()
    return panel


def _scan(qtbot: QtBot, panel: LibraryPanel) -> None:
    with qtbot.waitSignal(panel.local.scanned, timeout=SCAN_MS):
        panel.refresh()


def _import(qtbot: QtBot, panel: LibraryPanel, path: Path) -> None:
    with qtbot.waitSignal(panel.local.scanned, timeout=SCAN_MS):
        panel.local_files.import_file(path)


def _column(panel: LibraryPanel, column: int) -> dict[str, str]:
    model = panel.catalog
    return {p.id: model.data(model.index(row, column)) for row, p in enumerate(model.pairs)}


def test_the_catalog_has_fit_badges_and_the_library_lists_and_pairs_local_files(
    qtbot: QtBot, tmp_path: Path, gemma_path: Path, qwen_path: Path
) -> None:
    panel = _panel(qtbot, tmp_path / "models")
    pairs = curated.load()
    assert [p.id for p in panel.catalog.pairs] == [p.id for p in pairs]
    assert set(_column(panel, 2).values()) == {"checking this machine…"}
    with qtbot.waitSignal(panel.fit_scan.scanned, timeout=SCAN_MS):
        panel.start_scan()
    badges = _column(panel, 2)
    # the same figures as `python -m app models list` computes in this process (free memory may move a
    # context tier between the two looks, so the device is compared, not the context)
    expected = _fit_for_machine(pairs, 0)
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for p in pairs:
        assert re.fullmatch(r"fits gpu\S* @ \d+k|CPU only @ \d+k|too large for this machine", badges[p.id])
        if p.download_bytes < ram / 2:  # near the machine's free memory, a verdict may flip between looks
            assert badges[p.id].split(" @ ")[0] == expected[p.id]["badge"].split(" @ ")[0]
    assert _column(panel, 3) == {p.id: "not downloaded" for p in pairs}
    assert _column(panel, 1)[pairs[0].id].endswith("GiB")
    panel.catalog_table.select_pair(pairs[0].id)
    assert panel.catalog_table.machine.text().startswith(
        expected[pairs[0].id]["placement"]["reason"].split(":")[0]
    )

    # a file that is not a GGUF is refused with a message, and nothing is registered
    bad = tmp_path / "notes.gguf"
    bad.write_text("these are notes, not a model")
    with qtbot.waitSignal(panel.local.scanned, timeout=SCAN_MS):
        panel.refresh()
    job = panel.local_files.import_file(bad)
    qtbot.waitUntil(lambda: "Could not import notes.gguf" in panel.message.text(), timeout=SCAN_MS)
    job.wait()
    assert manifest.read(tmp_path / "models") == {}

    _import(qtbot, panel, gemma_path)
    rows = {m.path: m for m in panel.local.models}
    assert rows[gemma_path.resolve()].architecture == "gemma3"
    assert rows[gemma_path.resolve()].source == "import"
    assert panel.local.rowCount() == len(panel.local.models)
    assert panel.picker.target_choice.currentData() == str(gemma_path.resolve())
    assert panel.picker.drafter_choice.currentData() == NGRAM
    assert "Imported" in panel.message.text()

    # a drafter from another family: the verdict comes from both headers, rule by rule
    _import(qtbot, panel, qwen_path)
    panel.picker.choose(qwen_path.resolve(), gemma_path.resolve())
    qtbot.waitUntil(lambda: panel.picker.verdict is not None, timeout=SCAN_MS)
    assert panel.picker.verdict.mode == "cross-vocab"
    assert panel.picker.verdict_label.text().startswith("incompatible for token-level drafting")
    failed = {r.name for r in panel.picker.verdict.rules if not r.passed}
    assert "vocab size" in failed
    assert not panel.loader.use_button.isEnabled()  # no engine yet
    panel.wait()


def test_a_pair_downloads_pauses_resumes_and_a_cancel_leaves_nothing(
    qtbot: QtBot, tmp_path: Path, fake_hub: FakeHub, catalog_file: Path
) -> None:
    models = tmp_path / "models"
    panel = _panel(qtbot, models, catalog=catalog_file, endpoint=fake_hub.url)
    target_repo, drafter_repo = PAIR_REPOS["gemma-test"]
    fake_hub.reset_counters()
    seen: list[str] = []
    panel.catalog.progressChanged.connect(lambda pair_id: seen.append(panel.catalog.state_text(pair_id)))

    panel.catalog_table.select_pair("gemma-test")
    release = fake_hub.stall_after(target_repo, GEMMA_FILE, 64 << 20)
    panel.downloads.download_button.click()
    assert fake_hub.stalled.wait(60), "the download never reached the stall point"
    assert panel.downloads.pause_button.isEnabled()
    with qtbot.waitSignal(panel.catalog.downloadStopped, timeout=DOWNLOAD_MS) as stopped:
        panel.downloads.pause_button.click()
        release.set()
    assert stopped.args == ["gemma-test", True]
    part = download.library_path(models / download.PARTIAL_DIR, target_repo, GEMMA_FILE + ".part")
    kept = part.stat().st_size
    assert kept >= 32 << 20  # all but the chunk in hand when the pause landed
    assert re.fullmatch(r"paused at \d+%", panel.downloads.download_state.text())
    assert panel.downloads.download_button.text() == "Resume"
    assert 0 < panel.downloads.download_bar.value() < 1000

    with qtbot.waitSignal(panel.catalog.downloaded, timeout=DOWNLOAD_MS) as done:
        panel.downloads.download_button.click()
    target = download.library_path(models, target_repo, GEMMA_FILE)
    drafter = download.library_path(models, drafter_repo, GEMMA_FILE)
    assert done.args == ["gemma-test", [str(target), str(drafter)]]
    assert target.stat().st_size == drafter.stat().st_size == GEMMA_270M.size
    assert {e["sha256"] for e in manifest.read(models).values()} == {GEMMA_270M.sha256}
    # the resume fetched only the rest (a fresh start would have sent the kept bytes twice)
    assert fake_hub.bytes_sent(target_repo, GEMMA_FILE) < GEMMA_270M.size + kept
    assert any(re.match(r"downloading \d+% of 483 MiB at [\d.]+ MiB/s", s) for s in seen)
    assert any(s.startswith("verifying") for s in seen)
    assert panel.downloads.download_bar.value() == 1000
    assert _column(panel, 3)["gemma-test"] == "installed"
    assert not panel.downloads.download_button.isEnabled()
    # the library shows the new files and the pair is chosen for loading; same file: same vocabulary
    qtbot.waitUntil(lambda: panel.picker.target_choice.currentData() == str(target), timeout=SCAN_MS)
    assert panel.picker.drafter_choice.currentData() == str(drafter)
    qtbot.waitUntil(lambda: panel.picker.verdict is not None, timeout=SCAN_MS)
    assert panel.picker.verdict.compatible

    other_repo = PAIR_REPOS["gemma-other"][0]
    panel.catalog_table.select_pair("gemma-other")
    assert panel.downloads.download_button.isEnabled()
    release = fake_hub.stall_after(other_repo, GEMMA_FILE, 32 << 20)
    panel.downloads.download_button.click()
    assert fake_hub.stalled.wait(60)
    with qtbot.waitSignal(panel.catalog.downloadStopped, timeout=DOWNLOAD_MS) as stopped:
        panel.downloads.cancel_button.click()
        release.set()
    assert stopped.args == ["gemma-other", False]
    other_part = download.library_path(models / download.PARTIAL_DIR, other_repo, GEMMA_FILE + ".part")
    assert not other_part.exists()
    assert not download.library_path(models, other_repo, GEMMA_FILE).exists()
    assert _column(panel, 3)["gemma-other"] == "cancelled"
    assert panel.downloads.download_button.text() == "Download"

    # cancelling a paused download (no job runs) deletes its partial file too
    release = fake_hub.stall_after(other_repo, GEMMA_FILE, 32 << 20)
    panel.downloads.download_button.click()
    assert fake_hub.stalled.wait(60)
    with qtbot.waitSignal(panel.catalog.downloadStopped, timeout=DOWNLOAD_MS):
        panel.downloads.pause_button.click()
        release.set()
    assert other_part.stat().st_size > 0
    assert panel.downloads.cancel_button.isEnabled()
    with qtbot.waitSignal(panel.catalog.downloadStopped, timeout=DOWNLOAD_MS) as stopped:
        panel.downloads.cancel_button.click()
    assert stopped.args == ["gemma-other", False]
    assert not other_part.exists()
    assert not other_part.with_name(other_part.name + ".json").exists()
    assert _column(panel, 3)["gemma-other"] == "cancelled"
    panel.wait()


def test_a_download_that_fails_says_why(
    qtbot: QtBot, tmp_path: Path, fake_hub: FakeHub, catalog_file: Path
) -> None:
    panel = _panel(qtbot, tmp_path / "models", catalog=catalog_file, endpoint=fake_hub.url)
    target_repo = PAIR_REPOS["gemma-other"][0]
    fake_hub.repo_status[target_repo] = 403
    try:
        panel.catalog_table.select_pair("gemma-other")
        with qtbot.waitSignal(panel.catalog.downloadFailed, timeout=DOWNLOAD_MS):
            panel.downloads.download_button.click()
    finally:
        fake_hub.repo_status.clear()
    # the reason is said once, under the table; the table's row says only that it failed
    assert panel.downloads.download_state.text().startswith("Download failed:")
    assert "403" in panel.downloads.download_state.text()
    assert panel.message.text() == ""
    assert _column(panel, 3)["gemma-other"] == "download failed"
    row = panel.catalog.row_of("gemma-other")
    assert "403" in panel.catalog.data(panel.catalog.index(row, 3), Qt.ItemDataRole.ToolTipRole)
    assert panel.downloads.download_bar.isHidden()  # no empty bar that looks like an input field
    assert panel.downloads.download_button.isEnabled()  # it can be tried again
    # squeezed, the table still shows rows, and long text is shortened with "…" in columns one can widen
    view = panel.catalog_table.view
    assert view.minimumHeight() >= 4 * view.verticalHeader().defaultSectionSize()
    assert view.textElideMode() == Qt.TextElideMode.ElideRight
    assert view.horizontalHeader().sectionResizeMode(1) == QHeaderView.ResizeMode.Interactive
    panel.wait()


@pytest.fixture
def engine(qtbot: QtBot, gemma_path: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess()
    with qtbot.waitSignal(proc.ready, timeout=ENGINE_MS):
        # a short longest draft keeps the engine's verify-cost calibration (run on each load) brief
        proc.start(["--target", str(gemma_path), "--no-draft", "--n-ctx", "1024", "--max-draft", "2"])
    yield proc
    proc.stop()


def test_use_this_pair_loads_it_into_the_running_engine(
    qtbot: QtBot, tmp_path: Path, gemma_path: Path, engine: EngineProcess
) -> None:
    panel = _panel(qtbot, tmp_path / "models")
    panel.loader.client.configure(engine.url, engine.token)
    assert not panel.loader.use_button.isEnabled()
    panel.engine_ready()
    headers = {"Authorization": f"Bearer {engine.token}"}
    before = httpx.get(f"{engine.url}/props", headers=headers).json()
    assert before["draft"]["source"] != "ngram"  # started without a drafter

    # a file that went away after the scan: the engine refuses it and says why; nothing changes
    gone = tmp_path / "gone" / "gone-gemma.gguf"
    gone.parent.mkdir()
    shutil.copyfile(gemma_path, gone)
    _import(qtbot, panel, gone)
    gone.unlink()
    panel.picker.choose(gone, NGRAM)
    with qtbot.waitSignal(panel.loader.loadFailed, timeout=ENGINE_MS) as failed:
        panel.loader.use_button.click()
    assert "no such model file" in failed.args[0]
    assert "HTTP 400" in failed.args[0]
    assert panel.message.text().startswith("The engine could not load the pair:")
    assert panel.loader.use_button.isEnabled()

    _import(qtbot, panel, gemma_path)
    panel.picker.choose(gemma_path.resolve(), NGRAM)
    stages: list[str] = []
    with qtbot.waitSignal(panel.loader.pairLoaded, timeout=ENGINE_MS) as loaded:
        panel.loader.use_button.click()
        assert panel.loader.load_bar.isVisible()
        assert panel.loader.load_bar.maximum() == 0  # busy: the engine reports stages, not shares
        assert not panel.loader.use_button.isEnabled()
        panel.loader.load_stream.stage.connect(stages.append)
    ready = loaded.args[0]
    assert ready["stage"] == "ready"
    assert ready["model"] == gemma_path.stem
    assert ready["draft"] == "ngram"
    assert ready["context_length"] > 0
    assert stages[-1] == "ready"
    assert not panel.loader.load_bar.isVisible()
    assert panel.loader.use_button.isEnabled()
    assert panel.loader.load_state.text().startswith(f"Loaded {gemma_path.stem}")
    # the engine serves the new pair: n-gram drafting now, without a restart
    after = httpx.get(f"{engine.url}/props", headers=headers).json()
    assert after["draft"]["source"] == "ngram"
    assert engine.state == "ready"
    models = httpx.get(f"{engine.url}/v1/models", headers=headers).json()
    assert models["data"][0]["id"] == gemma_path.stem
    panel.wait()
