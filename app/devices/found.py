"""What device discovery finds: the devices, each discovery path's result, and their one numbering."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GPU_KINDS = ("discrete", "integrated", "accelerator")
NOT_IN_BUILD = "not usable by this llama.cpp build"
REMOTE = "remote"  # the RPC workers' probe: run as "remote=host:port,host:port"


@dataclass
class Device:
    """Facts about one device, as discovered or as loaded from a JSON fixture."""

    name: str
    vendor: str  # nvidia, amd, apple, intel, cpu, ...
    kind: str  # discrete, integrated or cpu
    total_bytes: int = 0
    free_bytes: int = 0
    busy_percent: float | None = None
    arch: str = ""  # compute capability "8.6" or gfx arch "gfx1151"
    driver: str = ""
    backends: list[str] = field(default_factory=list)
    index: int = 0  # index among the GPUs llama.cpp sees; unused for the CPU
    cores: int = 0
    flags: list[str] = field(default_factory=list)
    endpoint: str = ""  # a remote device's worker, host:port
    latency_ms: float | None = None  # a remote device's round trip, measured

    @property
    def is_remote(self) -> bool:
        return self.kind == REMOTE

    @property
    def is_gpu(self) -> bool:
        """A real GPU: not the CPU, and not a software rasteriser such as Mesa's lavapipe."""
        return self.kind in GPU_KINDS


@dataclass
class ProbeResult:
    """One discovery path: what it found, or why it found nothing."""

    path: str  # nvml, amd-sysfs, cupy, llama.cpp, metal, cpu
    devices: list[Device] = field(default_factory=list)
    error: str = ""  # "library missing: ...", "no device", "driver error: ...", "timed out after ..."
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Discovery:
    probes: list[ProbeResult]

    def devices(self) -> list[Device]:
        """One entry per physical device, NVML and sysfs first, then the RPC workers', the CPU last,
        numbered as llama.cpp does.

        Where llama.cpp's own device list was read, each GPU takes llama.cpp's index (its CUDA order is
        fastest-first, Vulkan's is the driver's, and NVIDIA and AMD probes both count from 0), and a GPU
        that this llama.cpp build cannot run says so in its flags. Remote devices are RPC0, RPC1, ... in
        the order of the workers, as llama.cpp names them when they join.
        """
        gpus = [d for p in self.probes if p.path in ("nvml", "amd-sysfs", "metal") for d in p.devices]
        remote = [d for p in self.probes if p.path == REMOTE for d in p.devices]
        cpus = [d for p in self.probes if p.path == "cpu" for d in p.devices]
        llama = next((p for p in self.probes if p.path == "llama.cpp"), None)
        if llama is not None and not llama.error.startswith(("library missing", "timed out", "probe")):
            gpus = _llama_numbering(gpus, [d for d in llama.devices if d.is_gpu])
        return gpus + remote + cpus

    def llama_build(self) -> str:
        """The installed llama.cpp build in words: CPU, CUDA sm_90, Vulkan, HIP gfx1100 (+ RPC)."""
        llama = next((p for p in self.probes if p.path == "llama.cpp"), None)
        return str(llama.info.get("build", "unknown")) if llama is not None else "not probed"

    def to_json(self) -> dict[str, Any]:
        return {"probes": [asdict(p) for p in self.probes]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Discovery:
        probes = []
        for p in data["probes"]:
            devices = [Device(**d) for d in p.get("devices", [])]
            probes.append(ProbeResult(p["path"], devices, p.get("error", ""), p.get("info", {})))
        return cls(probes)


def _same_device(gpu: Device, ggml: Device) -> bool:
    if gpu.name and (gpu.name in ggml.name or ggml.name in gpu.name):
        return True
    # sysfs names cards card0, card1: their memory tells them apart
    return bool(gpu.total_bytes and ggml.total_bytes) and abs(gpu.total_bytes - ggml.total_bytes) <= (
        0.03 * gpu.total_bytes
    )


def _llama_numbering(gpus: list[Device], ggml_gpus: list[Device]) -> list[Device]:
    """Each GPU with llama.cpp's index: matched by name or memory, then what is left in order (Metal's
    device names differ from the probe's); one with no llama.cpp device left is flagged."""
    matches: dict[int, Device] = {}
    free = list(ggml_gpus)
    for i, gpu in enumerate(gpus):
        match = next((g for g in free if _same_device(gpu, g)), None)
        if match is not None:
            matches[i] = match
            free.remove(match)
    for i, _gpu in enumerate(gpus):
        if i not in matches and free:
            matches[i] = free.pop(0)
    out = []
    for i, gpu in enumerate(gpus):
        match = matches.get(i)
        if match is None:
            out.append(Device(**{**asdict(gpu), "flags": [*gpu.flags, NOT_IN_BUILD]}))
            continue
        backends = [*gpu.backends, *(b for b in match.backends if b not in gpu.backends)]
        out.append(Device(**{**asdict(gpu), "index": match.index, "backends": backends}))
    return out
