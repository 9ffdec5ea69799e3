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
