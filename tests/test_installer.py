"""The frozen bundle (`make installer`): its engine serves, its probes run, its installer installs.

These run when the bundle has been built (.ci/run builds it after `make test`); with
FORESIGHT_INSTALLER_TEST=1 a missing bundle fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "build" / "installer" / "dist" / "Foresight"
EXE = BUNDLE / "Foresight"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exe() -> Path:
    if not EXE.exists():
        if os.environ.get("FORESIGHT_INSTALLER_TEST") == "1":
            pytest.fail(f"no frozen bundle at {BUNDLE}: run `make installer` first")
        pytest.skip("no frozen bundle: `make installer` builds it")
    return EXE


@pytest.fixture(scope="module")
def frozen_engine(exe: Path, gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("frozen-home")
    env = {**os.environ, "FORESIGHT_HOME": str(home)}
    env.pop("PYTHONPATH", None)
    log = home / "engine.log"  # a file, not a pipe: nothing can fill up and stall the engine
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(exe), "--engine", "--target", str(gemma_path), "--ngram", "--port", "0", "--n-ctx", "1024"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None and proc.poll() is None and time.monotonic() < deadline:
            ready = [ln for ln in log.read_text().splitlines() if ln.startswith("READY port=")]
            port = int(ready[0].split("=", 1)[1]) if ready else None
            time.sleep(0.05)
        assert port, f"the frozen engine did not get READY: {log.read_text()[-2000:]}"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        assert proc.wait(30) == 0  # a clean stop on SIGTERM


def test_frozen_engine_answers(frozen_engine: str) -> None:
    assert httpx.get(f"{frozen_engine}/health", timeout=10).status_code == 200
    response = httpx.post(
        f"{frozen_engine}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Count: one, two, three,"}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["completion_tokens"] > 0


def _frozen_answer(exe: Path, gemma: Path, home: Path, device: str, env: dict[str, str]) -> dict:
    """One greedy chat answer (16 tokens, logprobs with the top 2) from a frozen engine on `device`."""
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"engine-{device}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(exe), "--engine", "--target", str(gemma), "--no-draft", "--device", device, "--port", "0",
             "--n-ctx", "1024"],
            stdout=out, stderr=subprocess.STDOUT, env={**env, "FORESIGHT_HOME": str(home)},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        port = None
        while port is None and proc.poll() is None and time.monotonic() < deadline:
            ready = [ln for ln in log.read_text().splitlines() if ln.startswith("READY port=")]
            port = int(ready[0].split("=", 1)[1]) if ready else None
            time.sleep(0.1)
        assert port, f"the frozen engine did not get READY on {device}: {log.read_text()[-2000:]}"
        url = f"http://127.0.0.1:{port}"
        props = httpx.get(f"{url}/props", timeout=30).json()
        # the first call on lavapipe compiles Vulkan pipelines (about 40 s measured)
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 16,
                  "temperature": 0, "logprobs": True, "top_logprobs": 2},
            timeout=300,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        return {"props": props, "choice": answer.json()["choices"][0]}
    finally:
        proc.terminate()
        proc.wait(60)


def test_frozen_vulkan_runtime_answers_on_lavapipe_as_the_cpu_does(
    exe: Path, gemma_path: Path, tmp_path: Path
) -> None:
    """The bundle's Vulkan backend on Mesa's lavapipe (Vulkan on the CPU, made visible to llama.cpp by
    GGML_VK_VISIBLE_DEVICES): the device is listed, and its greedy answer equals the CPU's up to a
    near-tie (where the CPU's top-2 logit margin is below bench.NEAR_TIE)."""
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"}
    env.pop("PYTHONPATH", None)
    devices = subprocess.run(
        [str(exe), "devices", "--json"], capture_output=True, text=True, timeout=180, env=env, check=True
    )
    found = json.loads(devices.stdout)
    if "Vulkan" not in found["build"]:
        pytest.skip(f"this bundle's llama.cpp has no Vulkan backend ({found['build']})")
    llama = next(p for p in found["probes"] if p["path"] == "llama.cpp")
    software = [d for d in llama["devices"] if d["kind"] == "software"]
    assert software, f"lavapipe not listed: {llama}"
    assert software[0]["name"].startswith("software Vulkan (CPU)")
    on_gpu = _frozen_answer(exe, gemma_path, tmp_path / "vk", "gpu", env)
    on_cpu = _frozen_answer(exe, gemma_path, tmp_path / "cpu", "cpu", env)
    assert on_gpu["props"]["target"]["device"] == "gpu"
    assert on_cpu["props"]["target"]["device"] == "cpu"
    vk_tokens = on_gpu["choice"]["logprobs"]["content"]
    cpu_tokens = on_cpu["choice"]["logprobs"]["content"]
    for vk, cpu in zip(vk_tokens, cpu_tokens, strict=False):
        if vk["token"] != cpu["token"]:
            top = cpu["top_logprobs"]
            margin = top[0]["logprob"] - top[1]["logprob"]  # log-softmax differences are logit differences
            assert margin < 0.5, f"parted at {cpu['token']!r} vs {vk['token']!r} with margin {margin:.3f}"
            break
    else:
        assert on_gpu["choice"]["message"]["content"] == on_cpu["choice"]["message"]["content"]


def test_frozen_gui_smoke(exe: Path, gemma_path: Path, tmp_path: Path) -> None:
    """The frozen window opens, starts its own engine (the executable again, with --engine), and gets
    one real answer through its own client."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "FORESIGHT_HOME": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [str(exe), "gui", "--smoke", "--target", str(gemma_path), "--ngram", "--n-ctx", "1024"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "smoke: answered" in out.stdout


def test_frozen_device_probes_run_in_children(exe: Path) -> None:
    one = subprocess.run([str(exe), "--device-probe", "cpu"], capture_output=True, text=True, timeout=60)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["devices"][0]["kind"] == "cpu"
    every = subprocess.run([str(exe), "devices", "--json"], capture_output=True, text=True, timeout=180)
    assert every.returncode == 0, every.stderr
    paths = {p["path"]: p for p in json.loads(every.stdout)["probes"]}
    assert paths["cpu"]["devices"]
    assert paths["llama.cpp"]["devices"], "the portable build loads its CPU backend variant"


def test_frozen_catalog_is_bundled(exe: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "FORESIGHT_HOME": str(tmp_path / "foresight")}
    out = subprocess.run(
        [str(exe), "models", "list", "--json"], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["pairs"]) >= 10


def test_linux_installer_installs_and_uninstalls(exe: Path, tmp_path: Path) -> None:
    runs = sorted((ROOT / "dist").glob("Foresight-*-linux-x86_64.run"), key=lambda p: p.stat().st_mtime)
    if not runs:
        pytest.fail("make installer wrote no .run installer")
    home = tmp_path / "my home"  # a space in the path, as some users have
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    done = subprocess.run(["sh", str(runs[-1])], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    data = home / ".local" / "share"
    desktop = data / "applications" / "foresight.desktop"
    assert "Exec=" in desktop.read_text()
    assert (data / "icons" / "hicolor" / "256x256" / "apps" / "foresight.png").exists()
    installed = home / ".local" / "bin" / "foresight"
    version = subprocess.run([str(installed), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0
    assert version.stdout.startswith("Foresight")
    (data / "Foresight" / "chats.sqlite3").write_text("user data")
    gone = subprocess.run(
        ["sh", str(data / "Foresight" / "uninstall.sh")], capture_output=True, text=True, env=env
    )
    assert gone.returncode == 0, gone.stderr
    assert not desktop.exists()
    assert not installed.exists()
    assert not (data / "Foresight" / "app").exists()
    assert (data / "Foresight" / "chats.sqlite3").exists(), "uninstall keeps user data without --purge"
    # reinstall, then uninstall with --purge: the data goes too
    assert subprocess.run(["sh", str(runs[-1])], capture_output=True, env=env, timeout=300).returncode == 0
    purge = data / "Foresight" / "uninstall.sh"
    assert subprocess.run(["sh", str(purge), "--purge"], capture_output=True, env=env).returncode == 0
    assert not (data / "Foresight").exists()


def test_the_installer_refuses_to_replace_a_folder_that_is_not_foresight(exe: Path, tmp_path: Path) -> None:
    runs = sorted((ROOT / "dist").glob("Foresight-*-linux-x86_64.run"), key=lambda p: p.stat().st_mtime)
    prefix = tmp_path / "somewhere"
    (prefix / "app").mkdir(parents=True)
    (prefix / "app" / "precious.txt").write_text("keep me")
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "FORESIGHT_PREFIX": str(prefix)}
    done = subprocess.run(["sh", str(runs[-1])], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1
    assert "not a Foresight installation" in done.stdout
    assert (prefix / "app" / "precious.txt").read_text() == "keep me"


def test_unfrozen_entry_point_matches() -> None:
    """installer/entry.py is what the bundle runs; unfrozen it dispatches the same way."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "installer" / "entry.py"), "--device-probe", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["path"] == "cpu"
