"""Device discovery in child processes, and placement over a table of machines given as JSON fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.catalog.fit import GIB, ModelShape, PairNeed
from app.devices.child import run_probe_in_child
from app.devices.found import Discovery
from app.devices.placement import UserChoice, place

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]

# An 8B Q4_K_M target with a 1B drafter; a 32B-class target with a 3B drafter; a 50B-class target alone.
MID = PairNeed(ModelShape(int(4.9 * GIB), 32, 8, 128, 128, 131072), ModelShape(int(0.8 * GIB), 16, 8, 64, 64))
BIG = PairNeed(ModelShape(20 * GIB, 64, 8, 128, 128, 131072), ModelShape(2 * GIB, 16, 8, 64, 64))
HUGE = PairNeed(ModelShape(30 * GIB, 64, 8, 128, 128, 131072))


def machine(name: str) -> list:
    return Discovery.from_json(json.loads((FIXTURES / f"{name}.json").read_text())).devices()


# machine, need, user choice, device, draft device, tensor split, context, reason substring
CASES = [
    ("nvidia-8gb", MID, None, "gpu:0", "cpu", None, 4096, "drafter on the CPU"),
    ("nvidia-12gb", MID, None, "gpu:0", "gpu:0", None, 16384, "holds target and drafter"),
    ("nvidia-16gb", MID, None, "gpu:0", "gpu:0", None, 32768, "RTX 4080 (discrete) holds"),
    ("nvidia-24gb", MID, None, "gpu:0", "gpu:0", None, 32768, "RTX 3090 (discrete) holds"),
    ("rtx3090-rtx3060", MID, None, "gpu:0", "gpu:0", None, 32768, "RTX 3090"),
    ("rtx3090-rtx3060", BIG, None, "gpu:0", "gpu:1", None, 4096, "drafter on NVIDIA GeForce RTX 3060"),
    ("rtx3090-rtx3060", HUGE, None, "gpu", "gpu", [0.671, 0.329], 4096, "split over"),
    ("strix-halo-rtx4070", MID, None, "gpu:0", "gpu:0", None, 16384, "RTX 4070 (discrete)"),
    ("strix-halo-rtx4070", BIG, None, "gpu:1", "gpu:1", None, 32768, "Radeon 8060S (integrated)"),
    ("busy-gpu", MID, None, "cpu", "cpu", None, 32768, "busy (95% used)"),
    ("cpu-only", MID, None, "cpu", "cpu", None, 32768, "no GPU found"),
    ("apple-m2-max", MID, None, "gpu:0", "gpu:0", None, 32768, "Apple GPU (integrated) holds"),
    ("nvidia-24gb", MID, UserChoice(device="cpu", n_ctx=4096), "cpu", "cpu", None, 4096, "explicit"),
    ("nvidia-24gb", MID, UserChoice(n_ctx=8192), "gpu:0", "gpu:0", None, 8192, "holds"),
    ("nvidia-8gb", MID, UserChoice(draft_device="gpu:0"), "gpu:0", "gpu:0", None, 2048, "explicit"),
]


@pytest.mark.parametrize(
    ("name", "need", "user", "device", "draft", "split", "n_ctx", "reason"),
    CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)],
)
def test_placement(name, need, user, device, draft, split, n_ctx, reason) -> None:
    placed = place(machine(name), need, user)
    assert (placed.device, placed.draft_device, placed.tensor_split, placed.n_ctx) == (
        device, draft, split, n_ctx,
    )  # fmt: skip
    assert reason in placed.reason


def test_placement_fits_what_it_claims() -> None:
    """A one-GPU placement's need at its context fits the GPU's free memory; the next tier would not."""
    gpu = machine("nvidia-12gb")[0]
    placed = place([gpu], MID)
    assert MID.total(placed.n_ctx) <= gpu.free_bytes < MID.total(placed.n_ctx * 2)


def test_discovery_json_round_trip() -> None:
    loaded = Discovery.from_json(json.loads((FIXTURES / "strix-halo-rtx4070.json").read_text()))
    again = Discovery.from_json(json.loads(json.dumps(loaded.to_json())))
    assert again.devices() == loaded.devices()
    assert [d.kind for d in again.devices()] == ["discrete", "integrated", "cpu"]
    assert again.devices()[1].arch == "gfx1151"


def test_cli_on_this_machine() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "devices", "--json"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=True,
    )  # fmt: skip
    found = json.loads(done.stdout)
    probes = {p["path"]: p for p in found["probes"]}
    cpu = probes["cpu"]["devices"][0]
    assert cpu["kind"] == "cpu"
    assert cpu["cores"] >= 1
    assert cpu["total_bytes"] > GIB
    assert probes["nvml"]["devices"] or probes["nvml"]["error"]
    if not probes["nvml"]["devices"]:
        assert any(w in probes["nvml"]["error"] for w in ("library missing", "no NVIDIA driver", "no device"))
    assert [d["kind"] for d in probes["llama.cpp"]["devices"]][:1] == ["cpu"]  # llama.cpp's own list
    assert "placement" in found


def test_hanging_probe_is_killed_and_reported() -> None:
    start = time.monotonic()
    result = run_probe_in_child("hang", timeout=1.0, target="import time; time.sleep(60)")
    assert time.monotonic() - start < 10
    assert result.error.startswith("timed out after 1 s")
    assert result.devices == []


def test_crashing_probe_is_reported() -> None:
    result = run_probe_in_child("crash", timeout=20, target="import ctypes; ctypes.string_at(0)")
    assert "probe crashed" in result.error
    assert result.devices == []
