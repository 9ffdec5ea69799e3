"""llama.cpp's library in this process: initialised once, its log routed to logging, its recent errors.

Shared by everything that loads a model file through llama.cpp: the llama backend, and the tokenizer of
a backend that runs the weights itself (tokenizer.py). A GGML_BACKEND_DL build gets its backends here.
"""

from __future__ import annotations

# llama_cpp comes before NumPy: the other order was seen to segfault with a CUDA build.
import llama_cpp  # isort: skip

import collections
import ctypes
import logging
import threading
from pathlib import Path

log = logging.getLogger("foresight.llama")
_native_log = logging.getLogger("llama.cpp")
_recent_problems: collections.deque[str] = collections.deque(maxlen=8)  # llama.cpp's last warnings/errors
# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_last_level = [logging.DEBUG]
_init_lock = threading.Lock()
_initialised = False


@llama_cpp.llama_log_callback
def _on_native_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace").rstrip()
    py_level = _last_level[0] if level == 5 else _LEVELS.get(level, logging.DEBUG)
    _last_level[0] = py_level
    if not line:
        return
    if py_level >= logging.WARNING:
        _recent_problems.append(line)
    _native_log.log(py_level, line)


def ggml_library() -> ctypes.CDLL | None:
    """The libggml that llama.cpp itself loaded (its backend registry), or None when not found.

    Wheels and bundles hold copies rather than symlinks (libggml.so, .so.0, ...); opening another copy
    would load a second libggml with an empty registry, so on Linux the mapped file is used.
    """
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if Path(path).name.startswith("libggml.so"):
                return ctypes.CDLL(path)
    lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
    for name in ("libggml.so.0", "libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name))
    return None


def _load_dynamic_backends() -> None:
    """A GGML_BACKEND_DL build (the installer's portable one) registers no backend by itself: load them
    from the folder that holds its CPU variants, where ggml picks the best one for this machine."""
    ggml = ggml_library()
    if ggml is None:
        return
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    if ggml.ggml_backend_reg_count() > 0:
        return
    package = Path(llama_cpp.__file__).resolve().parent
    # the wheel installs the variants in <site-packages>/bin; the bundle keeps them in llama_cpp/lib
    for folder in (package / "lib", package.parent / "bin"):
        if any(folder.glob("*ggml-cpu*")):
            ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
            ggml.ggml_backend_load_all_from_path(str(folder).encode())
            log.info("loaded %d ggml backends from %s", ggml.ggml_backend_reg_count(), folder)
            return
    log.warning("this llama.cpp build loads its backends dynamically, and none was found")


_rpc_servers: dict[str, list[str]] = {}  # endpoint -> its devices' names in llama.cpp's registry (RPC0, ...)


_VOID, _NAME, _SIZE = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
_SIGNATURES = {  # (restype, argtypes) of the registry functions read here
    "ggml_backend_reg_by_name": (_VOID, [_NAME]),
    "ggml_backend_reg_get_proc_address": (_VOID, [_VOID, _NAME]),
    "ggml_backend_register": (None, [_VOID]),
    "ggml_backend_reg_dev_count": (_SIZE, [_VOID]),
    "ggml_backend_reg_dev_get": (_VOID, [_VOID, _SIZE]),
    "ggml_backend_reg_name": (_NAME, [_VOID]),
    "ggml_backend_dev_count": (_SIZE, []),
    "ggml_backend_dev_get": (_VOID, [_SIZE]),
    "ggml_backend_dev_name": (_NAME, [_VOID]),
    "ggml_backend_dev_type": (ctypes.c_int, [_VOID]),
    "ggml_backend_dev_backend_reg": (_VOID, [_VOID]),
}


def _typed(ggml: ctypes.CDLL) -> ctypes.CDLL:
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(ggml, name)
        function.restype, function.argtypes = restype, argtypes
    return ggml


def add_rpc_servers(endpoints: list[str]) -> dict[str, list[str]]:
    """Register ggml-rpc workers in llama.cpp's device registry, each once per process; their devices' names.

    Each worker must have answered the handshake (app.devices.rpc) just before: llama.cpp's RPC client
    aborts the whole process on a worker that is down or speaks another protocol version. A GGML_BACKEND_DL
    build has no ggml_backend_rpc_add_server symbol to link: it comes from the RPC registry.
    """
    ensure_backend()
    ggml = ggml_library()
    if ggml is None:
        raise OSError("libggml not found next to llama.cpp")
    ggml = _typed(ggml)
    rpc = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(rpc, b"ggml_backend_rpc_add_server") if rpc else None
    if not address:
        raise OSError("this llama.cpp build has no RPC backend (build it with -DGGML_RPC=ON: make llama)")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    for endpoint in endpoints:
        if endpoint in _rpc_servers:
            continue
        reg = add_server(endpoint.encode())
        if not reg:
            raise OSError(f"the RPC worker {endpoint} has no device")
        ggml.ggml_backend_register(reg)
        names = [
            ggml.ggml_backend_dev_name(ggml.ggml_backend_reg_dev_get(reg, i)).decode()
            for i in range(ggml.ggml_backend_reg_dev_count(reg))
        ]
        _rpc_servers[endpoint] = names
        log.info("RPC worker %s: devices %s", endpoint, ", ".join(names))
    return {e: _rpc_servers[e] for e in endpoints}


_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type


def model_devices(placed: str, pinned: bool) -> tuple[list[int], list[str]] | None:
    """The devices a model loads on once RPC workers joined this process (None while none did: llama.cpp's
    own choice stands), as pointers and names.

    llama.cpp's own choice would then put every worker's devices first in every model: a CPU or pinned
    model (the drafter) keeps to this machine's GPUs, and a split ("gpu") takes the workers' devices
    first and this machine's GPUs after them, in llama.cpp's order, which --tensor-split follows.
    """
    if not _rpc_servers:
        return None
    ggml = _typed(ggml_library())  # type: ignore[arg-type]  # set: a worker was added through it
    remote: list[int] = []
    gpus: list[int] = []
    igpus: list[int] = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        kind = ggml.ggml_backend_dev_type(dev)
        if ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(dev)) == b"RPC":
            remote.append(dev)
        elif kind == _DEV_GPU:
            gpus.append(dev)
        elif kind == _DEV_IGPU:
            igpus.append(dev)
    local = gpus or igpus  # integrated GPUs only where no discrete one is (as llama.cpp chooses)
    chosen = [*remote, *local] if placed == "gpu" and not pinned else local
    return chosen, [ggml.ggml_backend_dev_name(d).decode() for d in chosen]


def local_gpus() -> list[str]:
    """This machine's GPUs in llama.cpp's registry once RPC workers joined (their names)."""
    found = model_devices("cpu", pinned=True)
    return found[1] if found is not None else []


def devices_key(names: list[str]) -> str:
    """Devices named as their costs differ: a worker's device with its address (RPC0 is who joined first)."""
    where = {name: endpoint for endpoint, joined in _rpc_servers.items() for name in joined}
    return ",".join(f"{name}@{where[name]}" if name in where else name for name in names)


def ensure_backend() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            llama_cpp.llama_log_set(_on_native_log, ctypes.c_void_p(0))
            _load_dynamic_backends()
            llama_cpp.llama_backend_init()
            _initialised = True


def native_errors() -> str:
    """llama.cpp's recent warnings and errors, consumed: they explain the failure being reported."""
    lines = list(_recent_problems)[-3:]
    _recent_problems.clear()
    return "; ".join(lines)
