"""Which process imports llama_cpp: never the GUI process (it never loads a model), always an engine or
CLI process before NumPy (a CUDA build was seen to segfault with the other order)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imported(stderr: str) -> list[str]:
    """Module names in import order, from `python -X importtime` (one line per import, innermost first)."""
    return [m.group(1) for m in re.finditer(r"^import time:.*\|\s+(\S+)\s*$", stderr, re.M)]


def _env() -> dict[str, str]:
    return {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_the_gui_process_answers_without_importing_llama_cpp(gemma_path: Path) -> None:
    pytest.importorskip("PySide6")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "app", "gui", "--smoke", "--target", str(gemma_path),
         "--ngram", "--n-ctx", "1024"],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT, check=False,
    )  # fmt: skip
    assert "smoke: answered" in done.stdout, done.stdout + done.stderr[-2000:]
    modules = _imported(done.stderr)
    assert "PySide6.QtWidgets" in modules  # the window really ran in this process
    assert not [m for m in modules if m.split(".")[0] == "llama_cpp"]


@pytest.mark.parametrize("argv", [["serve", "--help"], ["bench", "--help"], ["devices", "--help"]])
def test_engine_and_cli_processes_import_llama_cpp_before_numpy(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "app", *argv],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=ROOT, check=True,
    )  # fmt: skip
    modules = _imported(done.stderr)
    # importtime lists a module when its import finishes: the native library (llama_cpp.llama_cpp, which
    # loads libllama) is in before any part of NumPy starts
    assert "llama_cpp.llama_cpp" in modules
    first_numpy = next((i for i, m in enumerate(modules) if m.split(".")[0] == "numpy"), len(modules))
    assert modules.index("llama_cpp.llama_cpp") < first_numpy
