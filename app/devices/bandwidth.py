"""A GPU's memory bandwidth, the bound of a memory-bound decode step: from NVML's figures, or measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COPY_BYTES = 512 << 20  # a device-to-device copy this large runs at the memory's speed, not its latency
COPY_REPEATS = 10


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float | None  # None: no bound known, `source` says why
    source: str  # where the figure comes from, with the raw values it was formed from

    @property
    def gb_s(self) -> float | None:
        return None if self.bytes_per_s is None else self.bytes_per_s / 1e9


def nvml_peak_bytes_per_s(bus_width_bits: int, max_memory_clock_mhz: float) -> float:
    """Peak memory bandwidth from NVML's figures: bus width (bits) x the memory's highest clock (Hz) x 2
    (two transfers a clock) / 8 bits a byte. An H200's NVML says 6016 bits x 3201 MHz: 4.81 TB/s."""
    return bus_width_bits * max_memory_clock_mhz * 1e6 * 2 / 8


def _pci_bus_id(gpu: int) -> str | None:
    """The PCI address of CUDA device `gpu`: NVML numbers devices by PCI order, CUDA by speed by default."""
    try:
        import cupy

        return str(cupy.cuda.runtime.deviceGetPCIBusId(gpu))
    except Exception:  # no CuPy, no driver, no such device: NVML's own numbering stands
        return None


def from_nvml(gpu: int = 0) -> Bandwidth:
    """NVIDIA's peak figure for CUDA device `gpu` (bytes_per_s None and the reason where NVML cannot say)."""
    try:
        import pynvml
    except ImportError:
        return Bandwidth(None, "NVML: pynvml (pip package nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Bandwidth(None, f"NVML: {exc}")
    try:
        bus_id = _pci_bus_id(gpu)
        handle = (
            pynvml.nvmlDeviceGetHandleByPciBusId(bus_id) if bus_id else pynvml.nvmlDeviceGetHandleByIndex(gpu)
        )
        name = pynvml.nvmlDeviceGetName(handle)
        width = int(pynvml.nvmlDeviceGetMemoryBusWidth(handle))
        clock = int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM))
    except pynvml.NVMLError as exc:
        return Bandwidth(None, f"NVML: {exc}")
    finally:
        pynvml.nvmlShutdown()
    if width <= 0 or clock <= 0:
        return Bandwidth(None, f"NVML: {name} reports a {width}-bit bus at {clock} MHz")
    source = f"NVML: {name}, {width}-bit memory bus x {clock} MHz max memory clock x 2 / 8"
    return Bandwidth(nvml_peak_bytes_per_s(width, clock), source)


def from_copy(gpu: int = 0, nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> Bandwidth:
    """Measured: the fastest of `repeats` device-to-device copies through CuPy (bytes read + bytes written
    over the time), for GPUs NVML does not know (AMD). A copy reaches less than the peak: a lower bound."""
    try:
        import cupy
    except ImportError:
        return Bandwidth(None, "copy: CuPy is not installed")
    try:
        with cupy.cuda.Device(gpu):
            free = int(cupy.cuda.runtime.memGetInfo()[0])
            n = min(nbytes, free // 8) // 256 * 256
            src, dst = cupy.ones(n, dtype=cupy.uint8), cupy.empty(n, dtype=cupy.uint8)
            stream = cupy.cuda.Stream(non_blocking=True)
            best = float("inf")
            for i in range(repeats + 1):
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                dst.data.copy_from_device_async(src.data, n, stream)
                end.record(stream)
                end.synchronize()
                if i:  # the first copy pays for first use
                    best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
            name = _device_name(cupy, gpu)
            del src, dst
            cupy.get_default_memory_pool().free_all_blocks()
    except Exception as exc:  # no driver or device: say so
        return Bandwidth(None, f"copy: {exc}")
    return Bandwidth(2 * n / best, f"measured: {name}, fastest of {repeats} device copies of {n >> 20} MiB")


def _device_name(cupy: Any, gpu: int) -> str:
    name = cupy.cuda.runtime.getDeviceProperties(gpu)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_bandwidth(gpu: int = 0) -> Bandwidth:
    """The bound for CUDA/HIP device `gpu`: NVML's peak, else a measured copy, else none with the reasons."""
    nvml = from_nvml(gpu)
    if nvml.bytes_per_s:
        return nvml
    copy = from_copy(gpu)
    if copy.bytes_per_s:
        return Bandwidth(copy.bytes_per_s, f"{copy.source} ({nvml.source})")
    return Bandwidth(None, f"no bound: {nvml.source}; {copy.source}")
