"""What the engine is doing and what it runs, for people: its state and current stage with progress (read
from the engine's log lines and a library load's events), and the loaded pair from its /props."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.services.client import EngineClient
from app.services.engine import CRASHED, READY, STARTING, STOPPED, STOPPING, EngineProcess

STAGE_LINE = re.compile(r"\bforesight\.worker: model: (?P<stage>[a-z][a-z ]*)$")
ASSEMBLY_LINE = re.compile(
    r"\bforesight\.assembly: assembling (?P<file>\S+): (?P<share>\d+)% of (?P<mib>\d+) MiB"
)
STAGE_WORDS = {
    "assembling the model": "assembling the model from its installed parts (first start only)",
    "finding devices": "finding this machine's devices",
    "loading target": "loading the model",
    "loading projector": "loading the vision projector",
    "loading drafter": "loading the drafter",
    "calibrating": "measuring this machine's speed for drafting",
    "unloading": "unloading the last model",
    "unloaded": "no model loaded",
}
DRAFT_WORDS = {"ngram": "drafts by n-gram lookup", "none": "no drafting"}


def model_name(part: dict[str, Any]) -> str:
    """A model's name from its /props part: the GGUF's own name, else its file name."""
    name = str(part.get("name") or "")
    return name or Path(str(part.get("path") or "?")).name


def device_name(part: dict[str, Any]) -> str:
    device = str(part.get("device") or "?")
    if device == "gpu":
        gpu = part.get("main_gpu")
        return f"GPU {gpu}" if isinstance(gpu, int) and gpu >= 0 else "GPU"
    return device.upper()


class EngineStatus(QObject):
    """The engine's state (stopped, starting, loading, ready, crashed), its stage in words and its
    progress (`share`, 0-100, or None where the engine does not say), and /props once it answers."""

    changed = Signal()

    def __init__(self, engine: EngineProcess, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.engine = engine
        self.client = client
        self.state = STOPPED
        self.stage = ""
        self.share: int | None = None
        self.props: dict[str, Any] = {}
        engine.stateChanged.connect(self._engine_state)
        engine.logLine.connect(self._line)

    # --- what the header shows --------------------------------------------------------------------

    @property
    def n_ctx(self) -> int | None:
        """The loaded context length; None until /props says (it may be sized by the engine's fit)."""
        n = (self.props.get("target") or {}).get("n_ctx")
        return int(n) if n else None

    @property
    def vision(self) -> bool:
        return bool(self.props.get("vision"))

    def target_text(self) -> str:
        if not self.props:
            return "No model loaded yet" if self.state != READY else "Asking the engine what it loaded…"
        return model_name(self.props.get("target") or {})

    def details_text(self) -> str:
        """The drafter, the device and the context, in one line ("" until /props answers)."""
        if not self.props:
            return ""
        target = self.props.get("target") or {}
        draft = self.props.get("draft") or {}
        source = str(draft.get("source") or "none")
        drafts = DRAFT_WORDS.get(source) or f"drafter {model_name(draft)} on {device_name(draft)}"
        parts = [f"on {device_name(target)}", drafts]
        if self.vision:
            parts.append("reads images")
        if self.n_ctx:
            parts.append(f"context {self.n_ctx:,} tokens")
        return " · ".join(parts)

    def state_text(self) -> str:
        if self.state == READY:
            return "Ready"
        if self.state == CRASHED:
            return "The engine stopped"
        if self.state in (STOPPED, STOPPING):
            return "The engine is not running"
        if self.state == "unloaded":
            return "No model loaded: the last load failed"
        words = STAGE_WORDS.get(self.stage, self.stage) or "starting the engine"
        share = f", {self.share}%" if self.share is not None else ""
        return f"{'Starting' if self.state == STARTING else 'Loading'}: {words}{share}…"

    @property
    def busy(self) -> bool:
        return self.state in (STARTING, "loading")

    # --- what feeds it ----------------------------------------------------------------------------

    def watch_load(self, stream: Any) -> None:
        """A pair loaded into the running engine (app.services.library.loading.LoadStream): its stages."""
        self.state, self.stage, self.share = "loading", "", None
        stream.stage.connect(self._load_stage)
        stream.done.connect(lambda _ready: self._loaded())
        stream.failed.connect(lambda _message: self._load_failed())
        self.changed.emit()

    def refresh(self) -> None:
        """Ask the engine what it runs (after it started, or loaded another pair)."""
        reply = self.client.get_json("/props")
        reply.done.connect(self._props)

    def _engine_state(self, state: str) -> None:
        self.state = state
        if state == STARTING:
            self.stage, self.share = "", None
        if state != READY:
            self.props = {}
        if state == READY:  # the window asks refresh() once its client knows the new port and token
            self.stage, self.share = "", None
        self.changed.emit()

    def _line(self, line: str) -> None:
        if self.state not in (STARTING, "loading"):
            return
        if (assembly := ASSEMBLY_LINE.search(line)) is not None:
            self.stage, self.share = "assembling the model", int(assembly["share"])
        elif (stage := STAGE_LINE.search(line)) is not None and stage["stage"] != "ready":
            self.stage, self.share = stage["stage"], None
        else:
            return
        self.changed.emit()

    def _load_stage(self, name: str) -> None:
        if name != "ready":
            self.stage, self.share = name, None
            self.changed.emit()

    def _loaded(self) -> None:
        self.state, self.stage, self.share = READY, "", None
        self.refresh()
        self.changed.emit()

    def _load_failed(self) -> None:
        self.state, self.stage, self.share, self.props = "unloaded", "unloaded", None, {}
        self.changed.emit()

    def _props(self, props: dict) -> None:
        if self.state == READY:
            self.props = props
            self.changed.emit()
