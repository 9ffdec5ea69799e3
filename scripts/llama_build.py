#!/usr/bin/env python3
# Over 500 lines: a standalone script (no Foresight imports: it runs before the venv has them).
"""Which llama.cpp build this machine gets, built once per flag set into a cache keyed by the flags.

`make run`, `make serve`, `make test` and `make installer` install llama-cpp-python through this script:

    python3 scripts/llama_build.py decide [--json]          the choice and why, in one line
    python3 scripts/llama_build.py install --python .venv/bin/python [--sdist F] [--find-links D]
    python3 scripts/llama_build.py rpc-server --python .venv/bin/python   only the RPC worker binary

It looks at the machine (NVIDIA GPU and CUDA toolkit with cuBLAS, AMD GPU and ROCm, Vulkan headers and
glslc), picks CUDA, HIP, Vulkan or CPU, and says which and why. Every build carries ggml-rpc. CPU and
Vulkan builds are portable across CPUs (`GGML_BACKEND_DL` with all CPU variants, chosen at run time), so
the same wheel serves `make`, the installer and the tests; CUDA and HIP builds are for this machine's
own CPU and GPU, with the GPU backend linked in (see LINKED_ARGS). pip caches wheels by name and
version, not by CMAKE_ARGS, so wheels are built into a folder keyed by the flags and installed from
there: a CPU wheel is never reused for a GPU build. The choice is recorded in the environment
(`foresight-llama-build.json` under its prefix), so an unchanged choice installs nothing and a changed
one rebuilds.

The `rpc-server` binary (the worker of another machine, `python -m app rpc-worker`) is a second CMake
build of the same vendored source: only `tools/rpc/rpc-server.cpp`, compiled against the headers and
linked against the libggml of the wheel of the same key, into `<key>/bin/` of the cache, once per flag
set. Linking against the wheel's libggml, rather than building ggml a second time, makes the worker
run the very backends the wheel carries (every CPU variant, the GPU backend), and builds in about a
minute where a second ggml build would take the wheel's time again (49 minutes with Vulkan on 2
cores). It is installed beside the wheel's backends (`<site-packages>/bin`), where
`ggml_backend_load_all()` looks (the executable's folder), with an rpath to the wheel's libggml.

Standard library only: it runs before the venv has anything in it.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

LLAMA_VERSION = "0.3.36"
RECORD = "foresight-llama-build.json"
MIN_ROCM = (6, 1)  # the vendored llama.cpp refuses older ROCm
# Every build: CPU variants picked at run time (no -march=native, so a bundle runs on any x86-64 CPU),
# backends as loadable libraries, and ggml-rpc for remote devices.
BASE_ARGS = ("-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_RPC=ON")
# CUDA and HIP wheels are from-source builds for this machine: one CPU backend for its own CPU and the GPU
# backend linked in. A CUDA wheel with GGML_BACKEND_DL and all CPU variants segfaulted in
# llama_model_load_from_file on the H200 test machine (CUDA 13.0, driver 580; with the CPU device too
# and with only the x64 variant present); the same flags without those two, built there before, load.
LINKED_ARGS = ("-DGGML_RPC=ON",)
# VK_EXT_layer_settings (vk::LayerSettingEXT) came with Vulkan headers 1.3.272; Debian 12 has 1.3.239.
VK_LAYER_SETTINGS_HEADER = 272
# CuPy for our kernels with NVRTC and the CUDA runtime from pip, so they need only the driver (CuPy's own
# `ctk` extra would add cuBLAS, cuFFT and the rest, about 1 GB that the kernels do not use).
CUPY_FOR_CUDA = {
    12: "cupy-cuda12x>=14 cuda-toolkit[nvrtc,cudart]==12.*",
    13: "cupy-cuda13x>=14 cuda-toolkit[nvrtc,cudart]==13.*",
}
CUPY_FOR_ROCM = {7: "cupy-rocm-7-0>=14"}


@dataclass(frozen=True)
class Machine:
    """What the choice depends on; `probe()` reads it off this machine, tests build it by hand."""

    system: str = "Linux"  # platform.system()
    nvidia_ccs: tuple[str, ...] = ()  # compute capabilities of the NVIDIA GPUs, e.g. ("9.0",)
    nvidia_driver_cuda: str = ""  # the CUDA version the driver supports, e.g. "13.0"
    nvcc: str = ""  # path of nvcc, "" when absent
    cuda_version: str = ""  # the toolkit's version, e.g. "13.0"
    cublas: bool = False  # cublas_v2.h and libcublas found for that toolkit
    amd_gfx: tuple[str, ...] = ()  # gfx targets of the AMD GPUs, e.g. ("gfx1030",)
    rocm_version: str = ""  # e.g. "6.2.4", "" without ROCm
    vulkan_headers: bool = False  # vulkan/vulkan.hpp
    spirv_headers: bool = False  # SPIRV-Headers (ggml-vulkan's CMake looks for its config)
    vk_header_version: int = 0  # VK_HEADER_VERSION
    glslc: str = ""
    cupy: str = ""  # the CuPy already importable by the target Python ("cupy 14.2.0, CUDA 13.0"), or ""
    user_cmake_args: str | None = None  # CMAKE_ARGS from the environment: honoured as given


@dataclass
class Choice:
    backend: str  # cuda, hip, vulkan, metal, cpu, or "user" for the user's own CMAKE_ARGS
    cmake_args: list[str]
    reason: str
    missing: list[str] = field(default_factory=list)  # what would give (a better) GPU path
    patches: list[str] = field(default_factory=list)  # source patches this build needs
    cupy: str = ""  # pip requirements for our kernels, space-separated; "" when none applies or CuPy is there

    @property
    def key(self) -> str:
        """The cache folder's name: the backend and a hash of everything that changes the wheel."""
        flags = json.dumps([LLAMA_VERSION, self.cmake_args, self.patches, platform.machine()])
        return f"{self.backend}-{hashlib.sha256(flags.encode()).hexdigest()[:12]}"

    def line(self) -> str:
        extra = f"; to use the GPU: {'; '.join(self.missing)}" if self.missing else ""
        return f"llama.cpp build: {self.backend.upper()} ({self.reason}){extra}"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def decide(m: Machine) -> Choice:
    """The llama.cpp build for a machine, with the reason and what is missing for a GPU path."""
    if m.user_cmake_args is not None and m.user_cmake_args.strip():
        args = shlex.split(m.user_cmake_args)
        return Choice("user", args, f"CMAKE_ARGS from the environment, as given: {m.user_cmake_args.strip()}")
    base = list(BASE_ARGS)
    missing: list[str] = []
    if m.system == "Darwin":
        return Choice("metal", [*base, "-DGGML_METAL=ON"], "macOS: Metal")

    cupy = ""
    if m.nvidia_ccs:
        major = int(_version_tuple(m.nvidia_driver_cuda)[0]) if m.nvidia_driver_cuda else 0
        if m.cupy:
            cupy = ""
        elif major in CUPY_FOR_CUDA:
            cupy = CUPY_FOR_CUDA[major]
        elif major:
            missing.append(f"CuPy has no wheel for the driver's CUDA {m.nvidia_driver_cuda}")
        archs = sorted({cc.replace(".", "") for cc in m.nvidia_ccs})
        if m.nvcc and m.cublas:
            ccs = ", ".join(m.nvidia_ccs)
            why = f"NVIDIA GPU (compute capability {ccs}), CUDA {m.cuda_version} with cuBLAS"
            args = [*LINKED_ARGS, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}"]
            return Choice("cuda", args, why, missing, [], cupy)
        if not m.nvcc:
            missing.append("the CUDA toolkit (nvcc) for a CUDA build")
        else:
            missing.append(
                f"cuBLAS for CUDA {m.cuda_version} (Debian: nvidia-cublas-dev / the CUDA toolkit's "
                "libcublas-dev; pip: nvidia-cublas, about 0.6 GB) for a CUDA build"
            )

    if m.amd_gfx:
        rocm = _version_tuple(m.rocm_version) if m.rocm_version else ()
        if rocm and rocm[:2] >= MIN_ROCM:
            targets = ";".join(sorted(set(m.amd_gfx)))
            rocm_cupy = "" if m.cupy else CUPY_FOR_ROCM.get(rocm[0], "")
            args = [*LINKED_ARGS, "-DGGML_HIP=ON", f"-DAMDGPU_TARGETS={targets}"]
            return Choice("hip", args, f"AMD GPU ({targets}), ROCm {m.rocm_version}", missing, [], rocm_cupy)
        if rocm:
            missing.append(f"ROCm 6.1 or newer for a HIP build (found {m.rocm_version})")
        else:
            missing.append("ROCm 6.1 or newer for a HIP build")

    if m.vulkan_headers and m.glslc and m.spirv_headers:
        patches = ["vulkan-layer-settings"] if m.vk_header_version < VK_LAYER_SETTINGS_HEADER else []
        gpu = "NVIDIA GPU" if m.nvidia_ccs else "AMD GPU" if m.amd_gfx else "any Vulkan GPU"
        why = f"Vulkan headers {m.vk_header_version} and glslc: {gpu}"
        return Choice("vulkan", [*base, "-DGGML_VULKAN=ON"], why, missing, patches, cupy)
    vulkan_packages = "libvulkan-dev, glslc and spirv-headers (Debian/Ubuntu), the Vulkan SDK elsewhere"
    if m.nvidia_ccs or m.amd_gfx:
        missing.append(f"or Vulkan: {vulkan_packages}")
        return Choice("cpu", base, "a GPU was found but no GPU toolchain to build for it", missing, [], cupy)
    missing.append(
        "no GPU found; with one, install its toolchain: CUDA toolkit with cuBLAS (NVIDIA), ROCm >= 6.1 "
        f"(AMD), or for any vendor Vulkan: {vulkan_packages}"
    )
    return Choice("cpu", base, "no GPU found", missing)


# --- reading the machine ------------------------------------------------------------------------------


def _run(*cmd: str, timeout: float = 20) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _nvidia() -> tuple[tuple[str, ...], str]:
    if not shutil.which("nvidia-smi"):
        return (), ""
    caps = _run("nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader")
    ccs = tuple(c.strip() for c in caps.splitlines() if re.fullmatch(r"\d+\.\d+", c.strip()))
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", _run("nvidia-smi"))
    return ccs, cuda.group(1) if cuda else ""


def _cuda_toolkit() -> tuple[str, str, bool]:
    nvcc = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/opt/cuda/bin/nvcc") if os.access(p, os.X_OK)), ""
    )
    if not nvcc:
        return "", "", False
    version = re.search(r"release ([\d.]+)", _run(nvcc, "--version"))
    home = Path(nvcc).resolve().parent.parent
    headers = [home / "include", *map(Path, glob.glob(str(home / "targets" / "*" / "include")))]
    libs = [home / "lib64", home / "lib", *map(Path, glob.glob(str(home / "targets" / "*" / "lib")))]
    cublas = any((d / "cublas_v2.h").is_file() for d in headers) and any(
        any(d.glob("libcublas.so*")) for d in libs if d.is_dir()
    )
    return nvcc, version.group(1) if version else "", cublas


def _amd() -> tuple[tuple[str, ...], str]:
    gfx: set[str] = set()
    for props in glob.glob("/sys/class/kfd/kfd/topology/nodes/*/properties"):
        text = Path(props).read_text(errors="replace")
        found = re.search(r"gfx_target_version\s+(\d+)", text)
        if found and int(found.group(1)):
            v = int(found.group(1))  # e.g. 100300 -> gfx1030, 90010 -> gfx90a
            major, minor, step = v // 10000, (v // 100) % 100, v % 100
            gfx.add(f"gfx{major}{minor:x}{step:x}")
    version = ""
    for info in ("/opt/rocm/.info/version", "/opt/rocm/.info/version-dev"):
        if Path(info).is_file():
            version = Path(info).read_text().strip()
            break
    if not version and shutil.which("hipconfig"):
        version = _run("hipconfig", "--version").strip()
    return tuple(sorted(gfx)), version


def _spirv_headers() -> bool:
    roots = ["/usr/share/cmake", "/usr/lib/cmake", "/usr/local/share/cmake", "/usr/local/lib/cmake",
             *glob.glob("/usr/lib/*/cmake")]  # fmt: skip
    if os.environ.get("VULKAN_SDK"):
        roots.append(str(Path(os.environ["VULKAN_SDK"]) / "lib" / "cmake"))
    return any((Path(r) / "SPIRV-Headers" / "SPIRV-HeadersConfig.cmake").is_file() for r in roots)


def _vulkan() -> tuple[bool, int, str]:
    header = next(
        (Path(p) for p in ("/usr/include/vulkan/vulkan_core.h", "/usr/local/include/vulkan/vulkan_core.h")
         if Path(p).is_file()),
        None,
    )  # fmt: skip
    sdk = os.environ.get("VULKAN_SDK")
    if header is None and sdk and (Path(sdk) / "include" / "vulkan" / "vulkan_core.h").is_file():
        header = Path(sdk) / "include" / "vulkan" / "vulkan_core.h"
    if header is None or not (header.parent / "vulkan.hpp").is_file():
        return False, 0, shutil.which("glslc") or ""
    found = re.search(r"#define VK_HEADER_VERSION (\d+)", header.read_text(errors="replace"))
    return True, int(found.group(1)) if found else 0, shutil.which("glslc") or ""


def _cupy_in(python: str) -> str:
    code = (
        "import cupy, cupy.cuda.runtime as r; v = r.runtimeGetVersion(); "
        "print(f'cupy {cupy.__version__}, runtime {v // 1000}.{v % 1000 // 10}')"
    )
    return _run(python, "-c", code, timeout=60).strip()


def probe(python: str = sys.executable) -> Machine:
    ccs, driver_cuda = _nvidia()
    nvcc, cuda_version, cublas = _cuda_toolkit()
    gfx, rocm = _amd()
    vk, vk_version, glslc = _vulkan()
    return Machine(
        system=platform.system(),
        nvidia_ccs=ccs,
        nvidia_driver_cuda=driver_cuda,
        nvcc=nvcc,
        cuda_version=cuda_version,
        cublas=cublas,
        amd_gfx=gfx,
        rocm_version=rocm,
        vulkan_headers=vk,
        spirv_headers=_spirv_headers(),
        vk_header_version=vk_version,
        glslc=glslc,
        cupy=_cupy_in(python) if (ccs or gfx) else "",
        user_cmake_args=os.environ.get("CMAKE_ARGS"),
    )


# --- building and installing --------------------------------------------------------------------------


def cache_root() -> Path:
    """Built wheels, one folder per flag set: FORESIGHT_BUILD_CACHE, else the user cache dir."""
    if os.environ.get("FORESIGHT_BUILD_CACHE"):
        return Path(os.environ["FORESIGHT_BUILD_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "foresight" / "llama-cpp-python"


def cached_wheel(choice: Choice, root: Path | None = None) -> Path | None:
    folder = (root or cache_root()) / LLAMA_VERSION / choice.key
    wheels = sorted(folder.glob(f"llama_cpp_python-{LLAMA_VERSION}-*.whl"))
    return wheels[-1] if wheels and (folder / "build.json").is_file() else None


def patch_vulkan_layer_settings(source: Path) -> bool:
    """Guard the VK_EXT_layer_settings block for Vulkan headers older than 1.3.272; True if patched."""
    path = source / "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    text = path.read_text()
    start = text.find("    VkBool32 enable_best_practice = layer_settings;")
    end_marker = "vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);"  # noqa: E501
    end = text.find(end_marker, start)
    if start < 0 or end < 0 or "FORESIGHT_VK_LAYER_SETTINGS" in text:
        return "FORESIGHT_VK_LAYER_SETTINGS" in text
    end += len(end_marker)
    guarded = (
        f"#if VK_HEADER_VERSION >= {VK_LAYER_SETTINGS_HEADER}  // FORESIGHT_VK_LAYER_SETTINGS\n"
        + text[start:end]
        + "\n#else\n    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, "
        "layers, extensions);\n#endif"
    )
    path.write_text(text[:start] + guarded + text[end:])
    return True


def sdist_cache() -> Path:
    """Downloaded sources, kept beside the built wheels: a second build (rpc-server) needs no network."""
    return cache_root().parent / "sdist"


def _sdist(given: str | None, find_links: list[str], work: Path) -> Path:
    if given:
        return Path(given)
    for folder in [*find_links, sdist_cache()]:
        found = sorted(Path(folder).glob(f"llama_cpp_python-{LLAMA_VERSION}*.tar.gz"))
        if found:
            return found[-1]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(work)]
    cmd += [arg for d in find_links for arg in ("--find-links", d)]
    subprocess.run([*cmd, f"llama-cpp-python=={LLAMA_VERSION}"], check=True)
    downloaded = next(work.glob(f"llama_cpp_python-{LLAMA_VERSION}*.tar.gz"))
    with contextlib.suppress(OSError):
        sdist_cache().mkdir(parents=True, exist_ok=True)
        shutil.copy2(downloaded, sdist_cache() / downloaded.name)
    return downloaded


def extract(tar: tarfile.TarFile, dest: Path, members: list[tarfile.TarInfo] | None = None) -> None:
    """Extract an sdist's files (all, or `members`) under dest, refusing any that would land outside it:
    tarfile's "data" filter where this Python has it (3.11.4+), else a check here that takes plain files
    and folders inside dest only (Debian 12's python3 is 3.11.2; the sdist holds no links)."""
    chosen = tar.getmembers() if members is None else members
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, chosen, filter="data")
        return
    root = dest.resolve()
    for member in chosen:
        target = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not target.is_relative_to(root):
            raise tarfile.TarError(f"refusing {member.name!r} of {tar.name}: not a plain file inside it")
    tar.extractall(dest, chosen)


def build(choice: Choice, sdist: str | None = None, find_links: list[str] = (), isolation: bool = True,
          root: Path | None = None) -> Path:  # fmt: skip
    """Build the wheel for `choice` into its keyed cache folder and return it."""
    folder = (root or cache_root()) / LLAMA_VERSION / choice.key
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="foresight-llama-") as tmp:
        work = Path(tmp)
        archive = _sdist(sdist, list(find_links), work)
        with tarfile.open(archive) as tar:
            extract(tar, work / "src")
        source = next((work / "src").iterdir())
        if "vulkan-layer-settings" in choice.patches and patch_vulkan_layer_settings(source):
            print(f"patched ggml-vulkan.cpp: VK_EXT_layer_settings guarded for headers < "
                  f"{VK_LAYER_SETTINGS_HEADER}", flush=True)  # fmt: skip
        env = dict(os.environ, CMAKE_ARGS=" ".join(choice.cmake_args))
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(work / "out")]
        cmd += [arg for d in find_links for arg in ("--find-links", d)]
        cmd += [] if isolation else ["--no-build-isolation"]
        log_path = folder / "build.log"
        started = time.monotonic()
        print(f"building llama-cpp-python {LLAMA_VERSION} ({choice.backend}); log: {log_path}", flush=True)
        with open(log_path, "w") as log:
            done = subprocess.run([*cmd, str(source)], env=env, stdout=log, stderr=subprocess.STDOUT)
        minutes = (time.monotonic() - started) / 60
        if done.returncode != 0:
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            raise BuildFailed(choice, "\n".join(tail))
        wheel = next((work / "out").glob("*.whl"))
        final = folder / wheel.name
        shutil.move(str(wheel), final)
    record = {**asdict(choice), "key": choice.key, "minutes": round(minutes, 1), "wheel": final.name}
    (folder / "build.json").write_text(json.dumps(record, indent=1))
    print(f"built in {minutes:.1f} min: {final}", flush=True)
    return final


class BuildFailed(RuntimeError):
    def __init__(self, choice: Choice, tail: str, what: str = "build") -> None:
        super().__init__(f"the {choice.backend} {what} failed:\n{tail}")
        self.choice = choice
        self.tail = tail


def _prefix(python: str) -> Path:
    return Path(_run(python, "-c", "import sys; print(sys.prefix)").strip() or sys.prefix)


def _read_record(home: Path) -> dict | None:
    try:
        return json.loads((home / RECORD).read_text())
    except (OSError, ValueError):
        return None


def installed_record(python: str) -> dict | None:
    return _read_record(_prefix(python))


def install(python: str, sdist: str | None = None, find_links: list[str] = (), isolation: bool = True,
            machine: Machine | None = None, target: str | None = None) -> Choice:  # fmt: skip
    """Decide, build if the cache lacks the wheel, install it into `python`'s environment (or into the
    folder `target`, for a PYTHONPATH), record it there."""
    machine = machine or probe(python)
    choice = decide(machine)
    print(choice.line(), flush=True)
    home = Path(target) if target else _prefix(python)
    record = _read_record(home)
    have = _run(python, "-c", "import importlib.metadata as m; print(m.version('llama-cpp-python'))").strip()
    if target:
        have = LLAMA_VERSION if list(home.glob(f"llama_cpp_python-{LLAMA_VERSION}.dist-info")) else ""
    if record and record.get("key") == choice.key and have == LLAMA_VERSION:
        print(f"llama-cpp-python {LLAMA_VERSION} ({choice.backend}) already installed", flush=True)
        if not installed_rpc_server(python, target).is_file():
            _with_rpc_server(python, choice, home, record, sdist, find_links, target)
        return choice
    wheel = cached_wheel(choice)
    if wheel is None:
        try:
            wheel = build(choice, sdist, find_links, isolation)
        except BuildFailed as failed:
            if choice.backend in ("cpu", "user"):
                raise
            print(f"{failed}\nfalling back to the CPU build", file=sys.stderr, flush=True)
            fallback = Choice("cpu", list(BASE_ARGS), f"the {choice.backend} build failed (see above)",
                              [*choice.missing, f"a working {choice.backend} toolchain"])  # fmt: skip
            choice = fallback
            wheel = cached_wheel(choice) or build(choice, sdist, find_links, isolation)
    else:
        print(f"using the cached wheel {wheel}", flush=True)
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps"]
    pip += ["--target", target, "--upgrade"] if target else ["--force-reinstall"]
    subprocess.run([*pip, str(wheel)], check=True)
    if choice.cupy:
        print(f"installing {choice.cupy} for our kernels", flush=True)
        cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", *choice.cupy.split()]
        cmd += [arg for d in find_links for arg in ("--find-links", d)]
        if subprocess.run(cmd, check=False).returncode != 0:
            print(f"could not install {choice.cupy}: our kernels stay off, llama.cpp runs", file=sys.stderr)
    elif machine.cupy:
        print(f"CuPy already there: {machine.cupy}", flush=True)
    record = {**asdict(choice), "key": choice.key, "cupy_found": machine.cupy, "wheel": Path(wheel).name}
    _with_rpc_server(python, choice, home, record, sdist, find_links, target)
    return choice


def _with_rpc_server(python: str, choice: Choice, home: Path, record: dict, sdist: str | None,
                     find_links: list[str], target: str | None) -> None:  # fmt: skip
    """Install the rpc-server of the installed wheel and write the record with where it went; a failed
    rpc-server build leaves the wheel installed (remote devices then have no local worker)."""
    wheel = (cache_root() / LLAMA_VERSION / choice.key / str(record.get("wheel", ""))).resolve()
    try:
        if not wheel.is_file():
            raise BuildFailed(choice, f"the wheel {wheel} is not in the cache", "rpc-server build")
        record = {**record, "rpc_server": str(install_rpc_server(python, choice, wheel, sdist, find_links,
                                                                 target))}  # fmt: skip
    except (BuildFailed, OSError, subprocess.CalledProcessError, StopIteration) as failed:
        print(f"no rpc-server: {failed}", file=sys.stderr, flush=True)
        record = {**record, "rpc_server": "", "rpc_server_error": str(failed).splitlines()[0]}
    (home / RECORD).write_text(json.dumps(record, indent=1))


# --- the rpc-server binary ---------------------------------------------------------------------------

RPC_SOURCE = "vendor/llama.cpp/tools/rpc/rpc-server.cpp"
RPC_RECORD = "rpc-server.json"
# where the executable finds libggml: beside it (the bundle's llama_cpp/lib), or from <site-packages>/bin
RPATH = {"Darwin": "@loader_path;@loader_path/../lib;@loader_path/../llama_cpp/lib",
         "Linux": "$ORIGIN;$ORIGIN/../lib;$ORIGIN/../llama_cpp/lib"}  # fmt: skip
RPC_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(foresight_rpc_server CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_BUILD_TYPE Release)
add_executable(rpc-server "${RPC_SOURCE}")
target_include_directories(rpc-server PRIVATE "${WHEEL_ROOT}/include")
find_library(GGML ggml PATHS "${WHEEL_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
find_library(GGML_BASE ggml-base PATHS "${WHEEL_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
target_link_libraries(rpc-server PRIVATE "${GGML}" "${GGML_BASE}")
set_target_properties(rpc-server PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "${RPATH}")
"""


def rpc_server_name(system: str | None = None) -> str:
    return "rpc-server.exe" if (system or platform.system()) == "Windows" else "rpc-server"


def cached_rpc_server(choice: Choice, root: Path | None = None) -> Path | None:
    """The rpc-server built for `choice`'s wheel, or None (a binary without its record is not trusted)."""
    folder = (root or cache_root()) / LLAMA_VERSION / choice.key / "bin"
    binary = folder / rpc_server_name()
    return binary if binary.is_file() and (folder / RPC_RECORD).is_file() else None


def _cmake(work: Path, find_links: list[str] = ()) -> str:
    """cmake from PATH, or from an importable `cmake` package (the one the wheel's own build uses), else
    that package installed aside (from --find-links too, for a machine without an index)."""
    found = shutil.which("cmake")
    if found:
        return found
    code = "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))"
    found = _run(sys.executable, "-c", code).strip()
    if found and os.access(found, os.X_OK):
        return found
    aside = work / "cmake-package"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target"]
    cmd += [str(aside), *(arg for d in find_links for arg in ("--find-links", d))]
    subprocess.run([*cmd, "cmake"], check=True)
    return next(str(p) for p in aside.glob("cmake/data/bin/cmake*") if p.is_file())


def build_rpc_server(choice: Choice, wheel: Path, sdist: str | None = None, find_links: list[str] = (),
                     root: Path | None = None) -> Path:  # fmt: skip
    """Compile rpc-server.cpp of the sdist against `wheel`'s headers and libggml, into `choice`'s cache
    folder (bin/); returns the binary."""
    folder = (root or cache_root()) / LLAMA_VERSION / choice.key / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="foresight-rpc-") as tmp:
        work = Path(tmp)
        archive = _sdist(sdist, list(find_links), work)
        with tarfile.open(archive) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(RPC_SOURCE))
            member.name = "rpc-server.cpp"
            extract(tar, work / "src", [member])
        with zipfile.ZipFile(wheel) as whl:  # the headers and libggml this worker links against
            whl.extractall(work / "wheel", [n for n in whl.namelist() if n.startswith(("include/", "lib/"))])
        (work / "src" / "CMakeLists.txt").write_text(RPC_CMAKE)
        cmake = _cmake(work, list(find_links))
        rpath = RPATH.get(platform.system(), "")
        configure = [cmake, "-S", str(work / "src"), "-B", str(work / "build"),
                     f"-DRPC_SOURCE={work / 'src' / 'rpc-server.cpp'}", f"-DWHEEL_ROOT={work / 'wheel'}",
                     f"-DRPATH={rpath}"]  # fmt: skip
        log_path = folder / "build.log"
        print(f"building rpc-server for {choice.backend} ({choice.key}); log: {log_path}", flush=True)
        with open(log_path, "w") as log:
            for cmd in (configure, [cmake, "--build", str(work / "build"), "--config", "Release"]):
                if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                    tail = log_path.read_text(errors="replace").splitlines()[-15:]
                    raise BuildFailed(choice, "\n".join(tail), "rpc-server build")
        built = next(p for p in (work / "build").rglob(rpc_server_name()) if p.is_file())
        binary = folder / rpc_server_name()
        shutil.copy2(built, binary)
    minutes = (time.monotonic() - started) / 60
    record = {"key": choice.key, "wheel": wheel.name, "source": RPC_SOURCE, "rpath": rpath,
              "linked_against": "the wheel's libggml and libggml-base",
              "minutes": round(minutes, 1)}  # fmt: skip
    (folder / RPC_RECORD).write_text(json.dumps(record, indent=1))
    print(f"built rpc-server in {minutes:.1f} min: {binary}", flush=True)
    return binary


def _site_packages(python: str, target: str | None) -> Path:
    if target:
        return Path(target)
    out = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    return Path(out)


def installed_rpc_server(python: str, target: str | None = None) -> Path:
    """Where the environment's rpc-server goes: beside the wheel's backends (<site-packages>/bin)."""
    return _site_packages(python, target) / "bin" / rpc_server_name()


def install_rpc_server(python: str, choice: Choice, wheel: Path, sdist: str | None = None,
                       find_links: list[str] = (), target: str | None = None) -> Path:  # fmt: skip
    """Build (once per flag set) and install the rpc-server of `choice`'s wheel; returns where it went."""
    binary = cached_rpc_server(choice)
    if binary is None:
        binary = build_rpc_server(choice, wheel, sdist, find_links)
    else:
        print(f"using the cached rpc-server {binary}", flush=True)
    dest = installed_rpc_server(python, target)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decide", help="print the choice and why")
    d.add_argument("--json", action="store_true")
    d.add_argument("--python", default=sys.executable, help="the Python whose CuPy counts")
    i = sub.add_parser("install", help="build (once per flag set) and install into --python's environment")
    i.add_argument("--python", required=True, help="the environment's python, e.g. .venv/bin/python")
    i.add_argument("--sdist", help="a llama-cpp-python sdist (.tar.gz) to build from instead of PyPI")
    i.add_argument("--find-links", action="append", default=[], help="a local folder of wheels/sdists")
    i.add_argument("--no-build-isolation", action="store_true", help="build with the packages already there")
    i.add_argument("--target", help="install into this folder (for PYTHONPATH) instead of the environment")
    r = sub.add_parser("rpc-server", help="build (once per flag set) and install only the rpc-server binary")
    r.add_argument("--python", required=True, help="the environment whose recorded wheel it goes with")
    r.add_argument("--sdist", help="a llama-cpp-python sdist (.tar.gz) to build from instead of PyPI")
    r.add_argument("--find-links", action="append", default=[], help="a local folder of wheels/sdists")
    r.add_argument("--target", help="the folder the wheel was installed into with install --target")
    args = parser.parse_args(argv)
    if args.command == "decide":
        machine = probe(args.python)
        choice = decide(machine)
        print(json.dumps({"machine": asdict(machine), "choice": {**asdict(choice), "key": choice.key}})
              if args.json else choice.line())  # fmt: skip
        return 0
    links = args.find_links + [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
    if args.command == "rpc-server":
        home = Path(args.target) if args.target else _prefix(args.python)
        record = _read_record(home)
        if record is None:
            print(f"no llama.cpp build recorded in {home}: run install first", file=sys.stderr)
            return 1
        choice = Choice(record["backend"], record["cmake_args"], record["reason"], record.get("missing", []),
                        record.get("patches", []), record.get("cupy", ""))  # fmt: skip
        _with_rpc_server(args.python, choice, home, record, args.sdist, links, args.target)
        return 0 if _read_record(home).get("rpc_server") else 1
    try:
        install(args.python, args.sdist, links, not args.no_build_isolation, target=args.target)
    except BuildFailed as failed:
        print(failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
