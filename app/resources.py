"""Files shipped beside the code (the kernel sources, the bench prompts): installed or in the checkout."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# What the wheel maps into the package (pyproject.toml [tool.setuptools.package-dir]): installed, `native/`
# becomes app/native and `bench/prompts.json` app/bench/prompts.json; a checkout keeps them at its top.
CHECKOUT = Path(__file__).resolve().parent.parent


def shipped(name: str) -> Path:
    """The folder or file `name` ("native", "bench/prompts.json") where this copy of the app has it: inside
    the installed (or frozen) package, else at the top of the source checkout that is running."""
    installed = Path(str(files("app"))) / name
    return installed if installed.exists() else CHECKOUT / name
