"""What the devices found mean for the user: the report `python -m app devices` prints, and the one fix
for each reason a GPU here goes unused."""

from __future__ import annotations

import json

from app.catalog.fit import GIB
from app.devices.found import NOT_IN_BUILD, REMOTE, Discovery


def report(discovery: Discovery) -> str:
    lines = []
    for p in discovery.probes:
        if p.devices:
            for d in p.devices:
                mem = f"{d.free_bytes / GIB:.1f}/{d.total_bytes / GIB:.1f} GiB free"
                extra = f", {d.cores} cores, {' '.join(d.flags)}" if d.cores else ""
                busy = f", {d.busy_percent:.0f}% busy" if d.busy_percent is not None else ""
                if d.latency_ms is not None:
                    extra += f", {d.latency_ms:.2f} ms round trip, {d.driver}"
                lines.append(f"{p.path:<10} {d.name} [{d.kind}] {mem}{busy}{extra}")
        if p.error:
            said = "not serving" if p.path == REMOTE else "no GPU" if p.devices else "nothing found"
            lines.append(f"{p.path:<10} {said}: {p.error}")
        if p.info and p.path != REMOTE:  # the workers' answers are the lines above
            lines.append(f"{'':<10} {json.dumps(p.info)}")
    lines.append(f"{'build':<10} llama.cpp {discovery.llama_build()}")
    cupy = next((p for p in discovery.probes if p.path == "cupy"), None)
    if cupy is not None:
        kernels = cupy.error or f"CuPy with {cupy.info.get('compiler', 'no runtime compiler')}"
        lines.append(f"{'kernels':<10} {kernels}")
    for fix in gpu_fixes(discovery):
        lines.append(f"{'fix':<10} {fix}")
    return "\n".join(lines)


def gpu_fixes(discovery: Discovery) -> list[str]:
    """Where a GPU is here but not used: the one thing to do about it, per cause."""
    gpus = [d for d in discovery.devices() if d.is_gpu]
    if not gpus:
        return []
    fixes = []
    build = discovery.llama_build()
    vendors = {d.vendor for d in gpus}
    if build.split(" + ")[0] == "CPU":
        toolchain = {
            "nvidia": "the CUDA toolkit with cuBLAS",
            "amd": "ROCm 6.1 or newer",
        }
        wanted = " or ".join(toolchain[v] for v in sorted(vendors) if v in toolchain)
        fixes.append(
            "this llama.cpp build runs on the CPU only: install "
            + (f"{wanted}, or " if wanted else "")
            + "libvulkan-dev, glslc and spirv-headers, then run `make llama` (it rebuilds for the GPU)"
        )
    elif any(NOT_IN_BUILD in d.flags for d in gpus):
        names = ", ".join(d.name for d in gpus if NOT_IN_BUILD in d.flags)
        driver = "the NVIDIA driver's Vulkan ICD" if "nvidia" in vendors else "mesa-vulkan-drivers"
        fixes.append(f"llama.cpp ({build}) does not see {names}: install its driver ({driver}) or rebuild "
                     "with `make llama`")  # fmt: skip
    cupy = next((p for p in discovery.probes if p.path == "cupy"), None)
    if "nvidia" in vendors and cupy is not None and cupy.error.startswith("library missing"):
        fixes.append("our kernels need CuPy: pip install 'foresight[cuda12]' (cuda13 for a CUDA 13 driver)")
    elif cupy is not None and str(cupy.info.get("compiler", "")).startswith("unavailable"):
        fixes.append("our kernels need NVRTC: pip install 'cuda-toolkit[nvrtc,cudart]==12.*' (or ==13.*)")
    return fixes
