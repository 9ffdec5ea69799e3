"""`serve` with no device flags places the model where the fit says and sizes the context from it; explicit
flags win; /props and `devices` say where and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from app.catalog import fit
from tests.support.server_helpers import engine_server

ROOT = Path(__file__).resolve().parents[2]


def _props(url: str) -> dict:
    return httpx.get(f"{url}/props", timeout=30).json()


def test_no_device_flags_means_the_fit_places_and_sizes_the_context(gemma_path: Path) -> None:
    trained = fit.read_shape(gemma_path).context_length
    with engine_server(["--target", str(gemma_path), "--no-draft"]) as server:
        props = _props(server.url)
    placed = props["placement"]
    # this machine has no GPU llama.cpp can use: the CPU holds it, at the largest tier it fits
    assert placed["device"] == "cpu"
    assert placed["reason"].startswith("CPU: ")
    assert placed["n_ctx"] == min(32768, trained)
    assert props["target"]["n_ctx"] == placed["n_ctx"]
    assert props["target"]["device"] == "cpu"


def test_explicit_flags_win(gemma_path: Path) -> None:
    argv = ["--target", str(gemma_path), "--no-draft", "--device", "cpu", "--n-ctx", "1024"]
    with engine_server(argv) as s:
        props = _props(s.url)
    assert props["placement"] == {"reason": "devices and context set explicitly"}
    assert props["target"]["n_ctx"] == 1024


def test_a_too_long_prompt_gets_context_length_exceeded_with_the_counts(gemma_path: Path) -> None:
    with engine_server(["--target", str(gemma_path), "--no-draft", "--device", "cpu", "--n-ctx", "256"]) as s:
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "word " * 400, "max_tokens": 4}, timeout=60)
        assert httpx.get(f"{s.url}/health", timeout=10).status_code == 200
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "256" in error["message"]


def test_devices_json_reports_the_placement_and_the_build(gemma_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "devices", "--json", "--target", str(gemma_path)],
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=True,
    )  # fmt: skip
    out = json.loads(done.stdout)
    assert out["placement"]["device"] == "cpu"
    assert out["placement"]["reason"]
    llama = next(p for p in out["probes"] if p["path"] == "llama.cpp")
    assert llama["info"]["build"].split(" + ")[0] in ("CPU", "Vulkan", "CUDA", "HIP")
    assert out["build"] == llama["info"]["build"]
