"""Device probes, one per discovery path (NVML, sysfs, CuPy, llama.cpp, Metal, CPU): each runs inside a
child process (app.devices.child), and here is also where the RPC workers join llama.cpp's device list."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from app.catalog.fit import GIB
from app.devices.found import Device, ProbeResult

SOFTWARE_GPUS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")  # Vulkan/GL on the CPU
BUILD_RECORD = "foresight-llama-build.json"  # written by scripts/llama_build.py into the environment


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
