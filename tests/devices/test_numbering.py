"""One GPU numbering (llama.cpp's), software Vulkan never counted as a GPU, the build named, the fix said,
and the placement applied to settings as the engine process does."""

from __future__ import annotations

import json
from pathlib import Path

from app.catalog.fit import GIB, ModelShape, PairNeed
from app.config import Settings
from app.devices import placement
from app.devices.found import NOT_IN_BUILD, Device, Discovery, ProbeResult
from app.devices.probe import build_label
from app.devices.report import gpu_fixes

FIXTURES = Path(__file__).parent / "fixtures"
MID = PairNeed(ModelShape(int(4.9 * GIB), 32, 8, 128, 128, 131072), ModelShape(int(0.8 * GIB), 16, 8, 64, 64))


def _fixture(name: str) -> Discovery:
    return Discovery.from_json(json.loads((FIXTURES / f"{name}.json").read_text()))


def _llama(*devices: Device, build: str = "CUDA sm_86", error: str = "") -> ProbeResult:
    return ProbeResult("llama.cpp", list(devices), error, {"build": build})


def _ggml(name: str, index: int, gib: float, kind: str = "discrete", backend: str = "CUDA") -> Device:
    return Device(name, "", kind, int(gib * GIB), int(gib * GIB), backends=[f"llama.cpp:{backend}{index}"],
                  index=index)  # fmt: skip


def test_gpus_take_llama_cpps_numbering() -> None:
    found = _fixture("rtx3090-rtx3060")
    # CUDA's default order is fastest-first; here llama.cpp lists the 3060 first
    found.probes.append(
        _llama(
            _ggml("NVIDIA GeForce RTX 3060", 0, 12),
            _ggml("NVIDIA GeForce RTX 3090", 1, 24),
            Device("AMD EPYC", "cpu", "cpu"),
        )
    )
    gpus = {d.name: d.index for d in found.devices() if d.is_gpu}
    assert gpus == {"NVIDIA GeForce RTX 3090": 1, "NVIDIA GeForce RTX 3060": 0}
    placed = placement.place(found.devices(), MID)
    assert placed.device == "gpu:1"  # the 3090, in llama.cpp's numbers
    assert "RTX 3090" in placed.reason


def test_a_gpu_this_build_cannot_run_is_not_placed_on_and_says_so() -> None:
    found = _fixture("nvidia-24gb")
    found.probes.append(_llama(Device("AMD EPYC", "cpu", "cpu"), build="CPU + RPC"))
    gpu = next(d for d in found.devices() if d.is_gpu)
    assert NOT_IN_BUILD in gpu.flags
    placed = placement.place(found.devices(), MID)
    assert placed.device == "cpu"
    assert NOT_IN_BUILD in placed.reason
    fixes = gpu_fixes(found)
    assert any("CPU only" in f and "CUDA toolkit with cuBLAS" in f and "make llama" in f for f in fixes)


def test_without_a_llama_probe_the_fixtures_keep_their_own_numbers() -> None:
    assert [d.index for d in _fixture("rtx3090-rtx3060").devices() if d.is_gpu] == [0, 1]


def test_software_vulkan_is_never_a_gpu() -> None:
    lavapipe = Device("software Vulkan (CPU): llvmpipe (LLVM 15.0.6, 256 bits)", "", "software")
    assert not lavapipe.is_gpu
    found = _fixture("cpu-only")
    found.probes.append(_llama(lavapipe, Device("AMD EPYC", "cpu", "cpu"), build="Vulkan + RPC"))
    assert not [d for d in found.devices() if d.is_gpu]
    assert placement.place(found.devices(), MID).device == "cpu"
    assert gpu_fixes(found) == []  # no GPU here: nothing to fix


def test_build_labels_come_from_the_registries_and_the_recorded_flags() -> None:
    cuda = {"cmake_args": ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]}
    assert build_label(["CUDA", "RPC", "CPU"], cuda) == "CUDA sm_90 + RPC"
    assert build_label(["Vulkan", "CPU"], {}) == "Vulkan"
    assert build_label(["ROCm", "CPU"], {"cmake_args": ["-DAMDGPU_TARGETS=gfx1100"]}) == "HIP gfx1100"
    assert build_label(["CPU"], {}) == "CPU"
    assert build_label(["RPC", "CPU"], {}) == "CPU + RPC"


def test_cupy_missing_beside_an_nvidia_gpu_names_the_package() -> None:
    found = _fixture("nvidia-24gb")
    found.probes.append(ProbeResult("cupy", error="library missing: cupy"))
    assert any("foresight[cuda12]" in f for f in gpu_fixes(found))


def test_the_placement_fills_only_what_was_automatic() -> None:
    devices = _fixture("nvidia-24gb").devices()
    auto = Settings.model_validate({"engine": {"n_ctx": 0}})
    assert placement.is_automatic(auto)
    placed = placement.place(devices, MID, placement.user_choice(auto))
    settled = placement.apply(auto, placed)
    engine = settled.engine
    assert (engine.device, engine.draft_device, engine.n_ctx) == ("gpu:0", "gpu:0", 32768)
    pinned = Settings.model_validate({"engine": {"device": "cpu", "draft_device": "cpu", "n_ctx": 8192}})
    assert not placement.is_automatic(pinned)
    kept = placement.apply(pinned, placement.place(devices, MID, placement.user_choice(pinned)))
    assert (kept.engine.device, kept.engine.n_ctx) == ("cpu", 8192)
    # a pinned device with the context left automatic: the largest tier that device holds
    cpu_auto = Settings.model_validate({"engine": {"device": "cpu", "n_ctx": 0}})
    sized = placement.place(devices, MID, placement.user_choice(cpu_auto))
    assert sized.device == "cpu"
    assert sized.n_ctx == 32768
    assert "explicit user choice; context 32,768 fits" in sized.reason
