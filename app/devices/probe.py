"""Device discovery: each path (NVML, sysfs, CuPy, llama.cpp, Metal, CPU, RPC workers) in a child with a
timeout. Over 500 lines: every probe the frozen build dispatches by name lives here, each a child's job."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.catalog.fit import GIB

PROBE_TIMEOUT_S = 20.0
GPU_KINDS = ("discrete", "integrated", "accelerator")
SOFTWARE_GPUS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")  # Vulkan/GL on the CPU
BUILD_RECORD = "foresight-llama-build.json"  # written by scripts/llama_build.py into the environment
NOT_IN_BUILD = "not usable by this llama.cpp build"
PROBE_FLAG = "--device-probe"  # how a frozen build runs one probe in a child: Foresight --device-probe nvml
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
    try:  # our kernels need the runtime compiler (NVRTC, or hipRTC under ROCm), not only the driver
        cupy.RawKernel('extern "C" __global__ void probe() {}', "probe").compile()
        result.info["compiler"] = "hipRTC" if runtime.is_hip else "NVRTC"
    except Exception as exc:  # a missing libnvrtc raises from deep inside CuPy
        result.info["compiler"] = f"unavailable: {str(exc).splitlines()[0][:200]}"
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
        registries = _ggml_registries()
    except (OSError, AttributeError) as exc:  # an older build without the device registry
        result.info["device_list"] = f"unavailable: {exc}"
        registries = []
    record = _build_record()
    result.info["backends"] = registries
    result.info["build"] = build_label(registries, record)
    if record:
        result.info["build_reason"] = record.get("reason", "")
    if not result.info["gpu_offload"]:
        result.error = "this llama.cpp build has no GPU backend (CPU only)"
    return result


def _build_record() -> dict[str, Any]:
    """What scripts/llama_build.py recorded about the installed wheel (beside sys.prefix or the bundle)."""
    import llama_cpp

    site = Path(llama_cpp.__file__).resolve().parents[1]  # a --target install keeps it beside the package
    for folder in (Path(sys.prefix), Path(sys.executable).resolve().parent, site):
        try:
            return json.loads((folder / BUILD_RECORD).read_text())
        except (OSError, ValueError):
            continue
    return {}


def build_label(registries: list[str], record: dict[str, Any]) -> str:
    """'CUDA sm_90 + RPC', 'Vulkan + RPC', 'HIP gfx1100', 'CPU': the registries are the truth, the record
    adds the architectures built for."""
    args = " ".join(record.get("cmake_args", []))
    parts: list[str] = []
    for name in registries:
        if name == "CUDA":
            archs = _flag(args, "CMAKE_CUDA_ARCHITECTURES")
            parts.append("CUDA " + " ".join(f"sm_{a}" for a in archs.split(";")) if archs else "CUDA")
        elif name in ("ROCm", "HIP"):
            gfx = _flag(args, "AMDGPU_TARGETS") or _flag(args, "GPU_TARGETS")
            parts.append(f"HIP {gfx.replace(';', ' ')}".strip())
        elif name not in ("CPU", "RPC"):
            parts.append(name)
    return " + ".join(parts or ["CPU"]) + (" + RPC" if "RPC" in registries else "")


def _flag(args: str, name: str) -> str:
    for word in args.split():
        if word.startswith(f"-D{name}="):
            return word.split("=", 1)[1]
    return ""


def _ggml_registries() -> list[str]:
    import ctypes

    from app.engine.backends.llama import ggml_library

    ggml = ggml_library()
    if ggml is None:
        raise OSError("libggml not found next to llama.cpp")
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    return [
        ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode(errors="replace")
        for i in range(ggml.ggml_backend_reg_count())
    ]


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
        description = ggml.ggml_backend_dev_description(dev).decode(errors="replace")
        if any(s in description.lower() for s in SOFTWARE_GPUS):
            kind, description = "software", f"software Vulkan (CPU): {description}"
        out.append(
            Device(
                description,
                "cpu" if kind == "cpu" else "",
                kind,
                total.value,
                free.value,
                backends=[f"llama.cpp:{backend}"],
                index=0 if kind == "cpu" else gpu_index,
            )
        )
        gpu_index += kind != "cpu"  # llama.cpp counts every non-CPU device, a software one too
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


def join_llama_registry(endpoints: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """RPC workers into llama.cpp's own device list, in the engine process: each one's device names, and
    this machine's GPUs beside them. app.devices.remote checks every worker first: llama.cpp aborts the
    process on one that cannot serve."""
    from app.engine.backends.llama import add_rpc_servers, local_gpus

    return add_rpc_servers(endpoints), local_gpus()


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
        command = [sys.executable, "-m", "app.devices.probe", "--probe", path]
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


def discover(
    timeout: float = PROBE_TIMEOUT_S, paths: tuple[str, ...] = tuple(PROBES), rpc_servers: str = ""
) -> Discovery:
    """Discovery paths, each in its own child process so that one broken driver costs only itself; the
    children run side by side, so the whole takes as long as the slowest. `rpc_servers` (host:port,...)
    adds the RPC workers' probe."""
    paths = (*paths, f"{REMOTE}={rpc_servers}") if rpc_servers else paths
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        return Discovery(list(pool.map(lambda path: run_probe_in_child(path, timeout), paths)))


PLACEMENT_PROBES = ("nvml", "amd-sysfs", "llama.cpp", "metal", "cpu")  # what placement reads


# ---- command line ----


def probe_main(path: str) -> int:
    """Run one discovery path and print its result as one JSON line (the child's half of a probe)."""
    if path.startswith(f"{REMOTE}="):
        from app.devices.remote import probe_remote

        print(json.dumps(asdict(probe_remote(path.partition("=")[2]))))
        return 0
    if path not in PROBES:
        print(f"unknown probe {path!r}: one of {', '.join(PROBES)}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(PROBES[path]())))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"] and len(sys.argv) == 3:
        sys.exit(probe_main(sys.argv[2]))
    from app.devices.report import report

    print(report(discover()))
