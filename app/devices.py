"""Device discovery (in a child process, with a timeout) and placement of a target/drafter pair."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.catalog.fit import CONTEXT_TIERS as FIT_TIERS
from app.catalog.fit import GIB, PairNeed

PROBE_TIMEOUT_S = 20.0
PROBE_FLAG = "--device-probe"  # how a frozen build runs one probe in a child: Foresight --device-probe nvml
BUSY_UTILISATION = 50  # percent; above it a device is someone else's
# automatic placement sizes the context up to 32k; larger contexts are an explicit choice
CONTEXT_TIERS = tuple(c for c in FIT_TIERS if c <= 32768)


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

    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"


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
        """Usable devices, one per physical device: NVML and sysfs first, the CPU last."""
        gpus = [d for p in self.probes if p.path in ("nvml", "amd-sysfs", "metal") for d in p.devices]
        cpus = [d for p in self.probes if p.path == "cpu" for d in p.devices]
        return gpus + cpus

    def to_json(self) -> dict[str, Any]:
        return {"probes": [asdict(p) for p in self.probes]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Discovery:
        probes = []
        for p in data["probes"]:
            devices = [Device(**d) for d in p.get("devices", [])]
            probes.append(ProbeResult(p["path"], devices, p.get("error", ""), p.get("info", {})))
        return cls(probes)


# ---- probes: each runs inside the child process ----


def probe_nvml() -> ProbeResult:
    result = ProbeResult("nvml")
    try:
        import pynvml
    except ImportError:
        result.error = "library missing: pynvml (pip package nvidia-ml-py)"
        return result
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        # NVML_ERROR_LIBRARY_NOT_FOUND: no NVIDIA driver installed.
        result.error = f"no NVIDIA driver: {exc}" if "Not Found" in str(exc) else f"driver error: {exc}"
        return result
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                busy: float | None = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except pynvml.NVMLError:
                busy = None
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            result.devices.append(
                Device(
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    vendor="nvidia",
                    kind="discrete",
                    total_bytes=int(mem.total),
                    free_bytes=int(mem.free),
                    busy_percent=busy,
                    arch=f"{major}.{minor}",
                    driver=driver.decode() if isinstance(driver, bytes) else str(driver),
                    backends=["cuda"],
                    index=i,
                )
            )
        if not result.devices:
            result.error = "no device"
    except pynvml.NVMLError as exc:
        result.error = f"driver error: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return result


def probe_amd_sysfs(root: Path = Path("/sys/class/drm")) -> ProbeResult:
    result = ProbeResult("amd-sysfs")
    if not root.is_dir():
        result.error = f"no {root} (no GPU driver loaded, or not Linux)"
        return result
    for card in sorted(root.glob("card[0-9]*")):
        dev = card / "device"
        if "-" in card.name or not (dev / "vendor").exists():
            continue  # connectors such as card0-DP-1
        if (dev / "vendor").read_text().strip() != "0x1002":
            continue
        try:
            total = int((dev / "mem_info_vram_total").read_text())
            used = int((dev / "mem_info_vram_used").read_text())
        except (OSError, ValueError):
            total = used = 0
        busy_file = dev / "gpu_busy_percent"
        busy = float(busy_file.read_text()) if busy_file.exists() else None
        # APUs report a small VRAM carve-out; a discrete card has its own memory of 2 GiB or more.
        kind = "discrete" if total >= 2 * GIB else "integrated"
        result.devices.append(
            Device(
                card.name, "amd", kind, total, total - used, busy, backends=["rocm", "vulkan"],
                index=len(result.devices),
            )
        )  # fmt: skip
    if not result.devices:
        result.error = "no device"
    return result


def probe_cupy() -> ProbeResult:
    result = ProbeResult("cupy")
    try:
        import cupy
    except ImportError:
        result.error = "library missing: cupy"
        return result
    try:
        runtime = cupy.cuda.runtime
        result.info["runtime_version"] = runtime.runtimeGetVersion()
        for i in range(runtime.getDeviceCount()):
            props = runtime.getDeviceProperties(i)
            with cupy.cuda.Device(i):
                free, total = runtime.memGetInfo()
            name = props["name"]
            result.devices.append(
                Device(
                    name.decode() if isinstance(name, bytes) else str(name),
                    "amd" if runtime.is_hip else "nvidia",
                    "discrete",
                    int(total),
                    int(free),
                    arch=f"{props['major']}.{props['minor']}",
                    backends=["cupy"],
                    index=i,
                )
            )
    except Exception as exc:  # CUDARuntimeError and friends; any failure is this path's answer
        result.error = f"driver error: {exc}"
        return result
    if not result.devices:
        result.error = "no device"
    return result


def probe_llama() -> ProbeResult:
    result = ProbeResult("llama.cpp")
    try:
        import llama_cpp
    except ImportError:
        result.error = "library missing: llama_cpp"
        return result
    from app.engine.backends.llama import ensure_backend

    ensure_backend()  # also loads the backends of a GGML_BACKEND_DL build
    result.info["gpu_offload"] = bool(llama_cpp.llama_supports_gpu_offload())
    result.info["max_devices"] = int(llama_cpp.llama_max_devices())
    try:
        result.devices = _ggml_devices(llama_cpp)
    except (OSError, AttributeError) as exc:  # an older build without the device registry
        result.info["device_list"] = f"unavailable: {exc}"
    if not result.info["gpu_offload"]:
        result.error = "this llama.cpp build has no GPU backend (CPU only)"
    return result


_GGML_DEV_KINDS = {0: "cpu", 1: "discrete", 2: "integrated", 3: "accelerator"}


def _ggml_devices(llama_cpp: Any) -> list[Device]:
    """llama.cpp's own backend device list, read from libggml (the 0.3.x bindings do not wrap it)."""
    import ctypes

    from app.engine.backends.llama import ggml_library

    ggml = ggml_library()
    if ggml is None:
        raise OSError("libggml not found next to llama.cpp")
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (ggml.ggml_backend_dev_name, ggml.ggml_backend_dev_description):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype, ggml.ggml_backend_dev_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    out, gpu_index = [], 0
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = _GGML_DEV_KINDS.get(ggml.ggml_backend_dev_type(dev), "accelerator")
        backend = ggml.ggml_backend_dev_name(dev).decode(errors="replace")
        out.append(
            Device(
                ggml.ggml_backend_dev_description(dev).decode(errors="replace"),
                "cpu" if kind == "cpu" else "",
                kind,
                total.value,
                free.value,
                backends=[f"llama.cpp:{backend}"],
                index=0 if kind == "cpu" else gpu_index,
            )
        )
        gpu_index += kind != "cpu"
    return out


def probe_metal() -> ProbeResult:
    result = ProbeResult("metal")
    if sys.platform != "darwin":
        result.error = "not macOS"
        return result
    apple = platform.machine() == "arm64"
    total = _total_ram()
    result.devices.append(
        Device(
            "Apple GPU" if apple else "Metal GPU", "apple", "integrated", total, total,
            backends=["metal"],
        )
    )  # fmt: skip
    return result


def _total_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def probe_cpu() -> ProbeResult:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    mem = _meminfo()
    total = mem.get("MemTotal") or _total_ram()
    free = mem.get("MemAvailable", total)
    flags: list[str] = []
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
            elif line.startswith(("flags", "Features")):
                have = set(line.partition(":")[2].split())
                flags = [f for f in ("avx2", "avx512f", "fma", "neon", "asimd") if f in have]
                break
    except OSError:
        pass
    if platform.machine() in ("arm64", "aarch64") and "neon" not in flags:
        flags.append("neon")
    cpu = Device(name, "cpu", "cpu", total, free, backends=["cpu"], cores=cores, flags=flags)
    return ProbeResult("cpu", [cpu])


PROBES = {
    "nvml": probe_nvml,
    "amd-sysfs": probe_amd_sysfs,
    "cupy": probe_cupy,
    "llama.cpp": probe_llama,
    "metal": probe_metal,
    "cpu": probe_cpu,
}


def run_probe_in_child(path: str, timeout: float = PROBE_TIMEOUT_S, target: str = "") -> ProbeResult:
    """Run one probe in a child Python process; a hang or crash becomes this path's error."""
    if getattr(sys, "frozen", False):  # the bundle dispatches this flag itself (installer/entry.py)
        command = [sys.executable, PROBE_FLAG, path]
    else:
        command = [sys.executable, "-m", "app.devices", "--probe", path]
    if target:
        command = [sys.executable, "-c", target]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ProbeResult(path, error=f"timed out after {timeout:g} s (the driver hung)")
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        return ProbeResult(path, error=f"probe crashed (exit code {done.returncode}) {tail[0]}".strip())
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ProbeResult(path, error="probe printed no result")
    return Discovery.from_json({"probes": [data]}).probes[0]


def discover(timeout: float = PROBE_TIMEOUT_S) -> Discovery:
    """Every discovery path, each in its own child process so that one broken driver costs only itself."""
    return Discovery([run_probe_in_child(path, timeout) for path in PROBES])


# ---- placement: a pure function over Device facts and a PairNeed ----


@dataclass(frozen=True)
class UserChoice:
    """Explicit settings; each one set wins over the automatic choice."""

    device: str = "auto"  # auto, cpu, gpu, gpu:N
    draft_device: str = "auto"
    tensor_split: tuple[float, ...] | None = None
    n_ctx: int = 0  # 0: sized from free memory


@dataclass
class Placement:
    device: str  # cpu, gpu:N, or "gpu" with a tensor_split
    draft_device: str
    tensor_split: list[float] | None
    n_ctx: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(d: Device) -> str:
    return "cpu" if not d.is_gpu else f"gpu:{d.index}"


def _usable(d: Device) -> tuple[bool, str]:
    if d.busy_percent is not None and d.busy_percent > BUSY_UTILISATION:
        return False, f"{d.name} is busy ({d.busy_percent:.0f}% used)"
    return True, ""


def _contexts(n_ctx: int, need: PairNeed) -> list[int]:
    if n_ctx:
        return [n_ctx]
    limit = need.target.context_length or CONTEXT_TIERS[0]
    tiers = [c for c in CONTEXT_TIERS if c <= limit]
    return tiers or [limit]


def place(devices: list[Device], need: PairNeed, user: UserChoice | None = None) -> Placement:
    """Where the target and drafter go, at what context length, and why.

    The strategy is chosen at the smallest context tier (a GPU that holds everything, then target and
    drafter apart, then a split target, then the CPU); the context is then the largest tier it still fits.
    """
    user = user or UserChoice()
    contexts = _contexts(user.n_ctx, need)
    notes: list[str] = []
    gpus = []
    for d in devices:
        if not d.is_gpu:
            continue
        ok, why = _usable(d)
        if ok:
            gpus.append(d)
        else:
            notes.append(why)
    gpus.sort(key=lambda d: (d.kind != "discrete", -d.free_bytes))
    suffix = f"; skipped {', '.join(notes)}" if notes else ""
    has_draft = need.drafter is not None
    cpu = next((d for d in devices if not d.is_gpu), None)

    if user.device != "auto" or user.draft_device != "auto" or user.tensor_split:
        n_ctx = user.n_ctx or contexts[-1]
        device = user.device if user.device != "auto" else (_label(gpus[0]) if gpus else "cpu")
        draft = user.draft_device if user.draft_device != "auto" else device
        split = list(user.tensor_split) if user.tensor_split else None
        return Placement(device, draft, split, n_ctx, "explicit user choice" + suffix)

    def one_gpu(n_ctx: int, gpus: list[Device]) -> Placement | None:
        for g in gpus:
            if need.total(n_ctx) <= g.free_bytes:
                what = "target and drafter" if has_draft else "the model"
                return Placement(
                    _label(g), _label(g), None, n_ctx,
                    f"{g.name} ({g.kind}) holds {what} "
                    f"({need.total(n_ctx) / GIB:.1f} of {g.free_bytes / GIB:.1f} GiB free){suffix}",
                )  # fmt: skip
        return None

    def apart(n_ctx: int, gpus: list[Device]) -> Placement | None:
        target_need = need.with_margin(need.target_bytes(n_ctx))
        draft_need = need.with_margin(need.drafter_bytes(n_ctx))
        for g in gpus:
            if not has_draft or target_need > g.free_bytes:
                continue
            for o in gpus:
                if o is not g and draft_need <= o.free_bytes:
                    return Placement(
                        _label(g), _label(o), None, n_ctx,
                        f"target on {g.name}, drafter on {o.name}: together they fit no single GPU{suffix}",
                    )  # fmt: skip
            return Placement(
                _label(g), "cpu", None, n_ctx,
                f"target on {g.name}, drafter on the CPU: together they do not fit the GPU{suffix}",
            )  # fmt: skip
        return None

    def split(n_ctx: int, gpus: list[Device]) -> Placement | None:
        free = sum(g.free_bytes for g in gpus)
        if len(gpus) < 2 or need.with_margin(need.target_bytes(n_ctx)) > free:
            return None
        ratios = [0.0] * (max(g.index for g in gpus) + 1)
        for g in gpus:
            ratios[g.index] = round(g.free_bytes / free, 3)
        names = " + ".join(g.name for g in gpus)
        return Placement(
            "gpu", "cpu" if has_draft else "gpu", ratios, n_ctx,
            f"target split over {names} by free memory: no single GPU holds it{suffix}",
        )  # fmt: skip

    def on_cpu(n_ctx: int, gpus: list[Device]) -> Placement | None:
        if cpu is not None and need.total(n_ctx) > cpu.free_bytes and n_ctx != contexts[-1]:
            return None
        why = "no GPU found" if not gpus and not notes else "no usable GPU holds the model"
        if cpu is not None and need.total(n_ctx) > cpu.free_bytes:
            why += f", and RAM is short too ({cpu.free_bytes / GIB:.1f} GiB free)"
        return Placement("cpu", "cpu", None, n_ctx, f"CPU: {why}{suffix}")

    for strategy in (one_gpu, apart, split, on_cpu):
        first = strategy(contexts[-1], gpus)
        if first is None:
            continue
        # Size the context on the devices chosen at the smallest tier (a discrete GPU at 16k beats an
        # integrated one at 32k).
        chosen = [g for g in gpus if _label(g) in (first.device, first.draft_device)] or gpus
        if first.tensor_split:
            chosen = gpus
        for n_ctx in contexts:
            placed = strategy(n_ctx, chosen)
            if placed is not None:
                return placed
    raise AssertionError("on_cpu always places at the smallest context")


# ---- command line ----


def report(discovery: Discovery) -> str:
    lines = []
    for p in discovery.probes:
        if p.devices:
            for d in p.devices:
                mem = f"{d.free_bytes / GIB:.1f}/{d.total_bytes / GIB:.1f} GiB free"
                extra = f", {d.cores} cores, {' '.join(d.flags)}" if d.cores else ""
                busy = f", {d.busy_percent:.0f}% busy" if d.busy_percent is not None else ""
                lines.append(f"{p.path:<10} {d.name} [{d.kind}] {mem}{busy}{extra}")
        if p.error:
            lines.append(f"{p.path:<10} {'no GPU' if p.devices else 'nothing found'}: {p.error}")
        if p.info:
            lines.append(f"{'':<10} {json.dumps(p.info)}")
    return "\n".join(lines)


def probe_main(path: str) -> int:
    """Run one discovery path and print its result as one JSON line (the child's half of a probe)."""
    if path not in PROBES:
        print(f"unknown probe {path!r}: one of {', '.join(PROBES)}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(PROBES[path]())))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"] and len(sys.argv) == 3:
        sys.exit(probe_main(sys.argv[2]))
    print(report(discover()))
