"""The llama.cpp build choice (scripts/llama_build.py) over machine descriptions, the flag-keyed cache,
the Vulkan header patch on the real vendored source, and the script run for real on this machine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("llama_build", ROOT / "scripts" / "llama_build.py")
lb = importlib.util.module_from_spec(_spec)
sys.modules["llama_build"] = lb
_spec.loader.exec_module(lb)

H200 = lb.Machine(nvidia_ccs=("9.0",), nvidia_driver_cuda="13.0", nvcc="/usr/local/cuda/bin/nvcc",
                  cuda_version="13.0", cublas=True)  # fmt: skip


def test_nvidia_with_a_full_toolkit_builds_cuda_for_its_own_arch_only() -> None:
    choice = lb.decide(H200)
    assert choice.backend == "cuda"
    assert "-DGGML_CUDA=ON" in choice.cmake_args
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in choice.cmake_args
    # the CUDA backend linked in, for this machine's CPU: a loadable-backends CUDA wheel segfaulted at model
    # load on the H200 test machine
    assert "-DGGML_BACKEND_DL=ON" not in choice.cmake_args
    assert "-DGGML_RPC=ON" in choice.cmake_args
    assert "9.0" in choice.reason
    assert "cuBLAS" in choice.reason
    assert choice.cupy == "cupy-cuda13x>=14 cuda-toolkit[nvrtc,cudart]==13.*"  # for the driver's CUDA
    assert choice.line().startswith("llama.cpp build: CUDA (")


def test_two_nvidia_archs_are_both_built() -> None:
    choice = lb.decide(lb.Machine(**{**H200.__dict__, "nvidia_ccs": ("8.6", "8.9")}))
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;89" in choice.cmake_args


def test_cupy_already_there_is_reported_not_installed() -> None:
    choice = lb.decide(lb.Machine(**{**H200.__dict__, "cupy": "cupy 14.2.0, runtime 13.0"}))
    assert choice.backend == "cuda"
    assert choice.cupy == ""


def test_nvidia_without_cublas_says_what_is_missing_and_takes_vulkan_where_it_can() -> None:
    no_cublas = lb.Machine(**{**H200.__dict__, "cublas": False})
    cpu = lb.decide(no_cublas)
    assert cpu.backend == "cpu"
    assert any("cuBLAS for CUDA 13.0" in m for m in cpu.missing)
    assert any("libvulkan-dev" in m for m in cpu.missing)
    assert "cuBLAS" in cpu.line()
    vulkan = lb.decide(lb.Machine(**{**no_cublas.__dict__, "vulkan_headers": True, "vk_header_version": 296,
                                     "glslc": "/usr/bin/glslc", "spirv_headers": True}))  # fmt: skip
    assert vulkan.backend == "vulkan"
    assert vulkan.patches == []
    assert any("cuBLAS" in m for m in vulkan.missing)
    assert vulkan.cupy  # our kernels need only the driver


def test_nvidia_without_nvcc_asks_for_the_toolkit() -> None:
    choice = lb.decide(lb.Machine(nvidia_ccs=("8.6",), nvidia_driver_cuda="12.4"))
    assert choice.backend == "cpu"
    assert any("nvcc" in m for m in choice.missing)
    assert choice.cupy.startswith("cupy-cuda12x>=14 ")


def test_amd_with_new_rocm_builds_hip_for_its_gfx_target() -> None:
    choice = lb.decide(lb.Machine(amd_gfx=("gfx1100",), rocm_version="6.2.4"))
    assert choice.backend == "hip"
    assert "-DGGML_HIP=ON" in choice.cmake_args
    assert "-DAMDGPU_TARGETS=gfx1100" in choice.cmake_args
    assert "-DGGML_BACKEND_DL=ON" not in choice.cmake_args


def test_amd_with_old_rocm_falls_to_vulkan_or_cpu_and_says_why() -> None:
    old = lb.Machine(amd_gfx=("gfx1030",), rocm_version="5.2.3")
    cpu = lb.decide(old)
    assert cpu.backend == "cpu"
    assert any("ROCm 6.1 or newer" in m and "5.2.3" in m for m in cpu.missing)
    vulkan = lb.decide(lb.Machine(**{**old.__dict__, "vulkan_headers": True, "vk_header_version": 239,
                                     "glslc": "/usr/bin/glslc", "spirv_headers": True}))  # fmt: skip
    assert vulkan.backend == "vulkan"
    assert "AMD GPU" in vulkan.reason


def test_vulkan_only_patches_old_headers() -> None:
    choice = lb.decide(lb.Machine(vulkan_headers=True, vk_header_version=239, glslc="/usr/bin/glslc",
                                  spirv_headers=True))  # fmt: skip
    assert choice.backend == "vulkan"
    assert "-DGGML_VULKAN=ON" in choice.cmake_args
    assert "-DGGML_BACKEND_DL=ON" in choice.cmake_args  # the installer's portable runtime
    assert choice.patches == ["vulkan-layer-settings"]
    no_spirv = lb.decide(lb.Machine(vulkan_headers=True, vk_header_version=239, glslc="/usr/bin/glslc"))
    assert no_spirv.backend == "cpu"
    assert "spirv-headers" in no_spirv.line()


def test_nothing_gives_the_cpu_build_with_what_would_give_a_gpu() -> None:
    choice = lb.decide(lb.Machine())
    assert choice.backend == "cpu"
    assert choice.cmake_args == list(lb.BASE_ARGS)
    assert "-DGGML_RPC=ON" in choice.cmake_args
    assert "-DGGML_NATIVE=OFF" in choice.cmake_args
    assert "libvulkan-dev" in choice.line()
    assert "ROCm" in choice.line()
    assert "cuBLAS" in choice.line()


def test_user_cmake_args_are_honoured_as_given() -> None:
    given = "-DGGML_CUDA=on -DGGML_CUDA_F16=on"
    choice = lb.decide(lb.Machine(**{**H200.__dict__, "user_cmake_args": given}))
    assert choice.backend == "user"
    assert choice.cmake_args == ["-DGGML_CUDA=on", "-DGGML_CUDA_F16=on"]
    assert "-DGGML_CUDA_F16=on" in choice.line()


def test_the_cache_is_keyed_by_the_flags_so_a_cpu_wheel_never_serves_a_gpu_build(tmp_path: Path) -> None:
    cpu, cuda = lb.decide(lb.Machine()), lb.decide(H200)
    assert cpu.key != cuda.key
    assert cpu.key.startswith("cpu-")
    assert cuda.key.startswith("cuda-")
    folder = tmp_path / lb.LLAMA_VERSION / cpu.key
    folder.mkdir(parents=True)
    (folder / f"llama_cpp_python-{lb.LLAMA_VERSION}-py3-none-linux_x86_64.whl").write_bytes(b"PK")
    (folder / "build.json").write_text(json.dumps({"key": cpu.key}))
    assert lb.cached_wheel(cpu, tmp_path) is not None
    assert lb.cached_wheel(cuda, tmp_path) is None
    # a wheel without its build record (an interrupted build) is not trusted
    (folder / "build.json").unlink()
    assert lb.cached_wheel(cpu, tmp_path) is None


def _sdist() -> Path | None:
    found = sorted((Path.home() / ".cache" / "foresight" / "sdist").glob("llama_cpp_python-*.tar.gz"))
    return found[-1] if found else None


@pytest.mark.skipif(_sdist() is None, reason="no llama-cpp-python sdist in ~/.cache/foresight/sdist")
def test_the_vulkan_patch_applies_to_the_vendored_source(tmp_path: Path) -> None:
    name = "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    with tarfile.open(_sdist()) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(name))
        member.name = f"src/{name}"
        lb.extract(tar, tmp_path, [member])
    source = tmp_path / "src"
    before = (source / name).read_text()
    assert lb.patch_vulkan_layer_settings(source)
    after = (source / name).read_text()
    assert after.count("FORESIGHT_VK_LAYER_SETTINGS") == 1
    assert f"#if VK_HEADER_VERSION >= {lb.VK_LAYER_SETTINGS_HEADER}" in after
    assert "layers, extensions);\n#endif" in after
    assert len(after) > len(before)
    assert lb.patch_vulkan_layer_settings(source)  # a second run leaves it as it is
    assert (source / name).read_text() == after


def test_decide_runs_on_this_machine_and_says_why() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "llama_build.py"), "decide", "--json"],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    out = json.loads(done.stdout)
    assert out["choice"]["backend"] in ("cpu", "vulkan", "cuda", "hip", "metal", "user")
    assert out["choice"]["reason"]


def test_the_installed_build_is_the_one_recorded() -> None:
    record = lb.installed_record(sys.executable)
    if record is None:
        pytest.skip("this environment's llama-cpp-python was not installed by scripts/llama_build.py")
    assert record["key"].startswith(record["backend"] + "-")
    assert record["wheel"].startswith(f"llama_cpp_python-{lb.LLAMA_VERSION}-")


def test_the_rpc_server_is_cached_by_the_flags_and_trusted_only_with_its_record(tmp_path: Path) -> None:
    cpu, cuda = lb.decide(lb.Machine()), lb.decide(H200)
    folder = tmp_path / lb.LLAMA_VERSION / cpu.key / "bin"
    folder.mkdir(parents=True)
    (folder / lb.rpc_server_name()).write_bytes(b"\x7fELF")
    assert lb.cached_rpc_server(cpu, tmp_path) is None  # no record: an interrupted build
    (folder / lb.RPC_RECORD).write_text(json.dumps({"key": cpu.key}))
    assert lb.cached_rpc_server(cpu, tmp_path) == folder / lb.rpc_server_name()
    assert lb.cached_rpc_server(cuda, tmp_path) is None
    assert lb.rpc_server_name("Windows") == "rpc-server.exe"


def _cached_wheel_of_this_venv() -> tuple[object, Path] | None:
    record = lb.installed_record(sys.executable)
    if record is None:
        return None
    choice = lb.Choice(
        record["backend"], record["cmake_args"], record["reason"], [], record.get("patches", [])
    )
    wheel = lb.cache_root() / lb.LLAMA_VERSION / record["key"] / record["wheel"]
    return (choice, wheel) if wheel.is_file() else None


@pytest.mark.skipif(_sdist() is None or _cached_wheel_of_this_venv() is None,
                    reason="needs the sdist and this environment's cached wheel")  # fmt: skip
def test_rpc_server_builds_from_the_sdist_against_the_wheels_libggml(tmp_path: Path) -> None:
    choice, wheel = _cached_wheel_of_this_venv()  # type: ignore[misc]
    binary = lb.build_rpc_server(choice, wheel, str(_sdist()), root=tmp_path)  # type: ignore[arg-type]
    assert binary == tmp_path / lb.LLAMA_VERSION / choice.key / "bin" / lb.rpc_server_name()  # type: ignore[attr-defined]
    record = json.loads((binary.parent / lb.RPC_RECORD).read_text())
    assert record["wheel"] == wheel.name
    assert record["minutes"] >= 0
    assert lb.cached_rpc_server(choice, tmp_path) == binary  # type: ignore[arg-type]
    if sys.platform.startswith("linux"):
        dynamic = subprocess.run(
            ["readelf", "-d", str(binary)], capture_output=True, text=True, check=True
        ).stdout
        assert "libggml.so.0" in dynamic
        assert "libggml-base.so.0" in dynamic
        assert "$ORIGIN/../lib" in dynamic  # the wheel's libggml from <site-packages>/bin


def test_this_environment_has_its_rpc_server_beside_the_backends() -> None:
    record = lb.installed_record(sys.executable)
    if record is None or "rpc_server" not in record:
        pytest.skip(
            "this environment's llama.cpp was not installed with an rpc-server by scripts/llama_build.py"
        )
    installed = lb.installed_rpc_server(sys.executable)
    assert installed.is_file()
    assert any(installed.parent.glob("*ggml-cpu*")), "rpc-server must sit where ggml loads its backends from"
    done = subprocess.run([str(installed), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0
    assert "--host HOST" in done.stderr


@pytest.mark.parametrize("data_filter", [True, False], ids=["data-filter", "python-3.11.2"])
def test_extract_keeps_an_archive_inside_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_filter: bool
) -> None:
    """Without tarfile's data filter (Python before 3.11.4, as Debian 12 ships) the check is our own."""
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    archive = tmp_path / "a.tar"
    payload = tmp_path / "payload.txt"
    payload.write_text("vendored source\n")
    with tarfile.open(archive, "w") as tar:
        tar.add(payload, "pkg/src/file.txt")
    with tarfile.open(archive) as tar:
        lb.extract(tar, tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "src" / "file.txt").read_text() == "vendored source\n"
    with tarfile.open(archive, "w") as tar:
        tar.add(payload, "../escaped.txt")
    with tarfile.open(archive) as tar, pytest.raises(tarfile.TarError):
        lb.extract(tar, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()
