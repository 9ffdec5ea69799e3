"""Which pair to load: a target, what drafts for it and a vision projector, among the local files, with
the pairing verdict of the two models."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from app.catalog.pairing import Verdict
from app.services.library.background import BackgroundJobs
from app.services.library.local_models import LocalModels
from app.services.library.verdict import read_verdict

NGRAM, NO_DRAFT = "ngram", "none"


class PickedPair(NamedTuple):
    """A pair to load: the target, a drafter model (None: n-gram drafting or none), n-gram drafting, and a
    vision projector (None: text only); in EngineLaunch.with_pair's order."""

    target: str
    draft: str | None
    ngram: bool
    mmproj: str | None


class PairPicker(QWidget):
    """Target, "Drafts from" (n-gram lookup, nothing, or a drafter model) and "Images" among the files
    `local` lists; the verdict of a target and a drafter model comes from both headers, read on a worker
    thread. `changed` says the picked pair changed."""

    changed = Signal()

    def __init__(self, local: LocalModels, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.local = local
        self.jobs = BackgroundJobs(self)
        self.verdict: Verdict | None = None
        self._wanted: dict[str, str | None] | None = None  # paths to choose once a library scan shows them
        self.target_choice = QComboBox()
        self.drafter_choice = QComboBox()
        self.projector_choice = QComboBox()  # a vision projector for the target, or none
        self.target_choice.currentIndexChanged.connect(self._pair_changed)
        self.drafter_choice.currentIndexChanged.connect(self._pair_changed)
        self.projector_choice.currentIndexChanged.connect(lambda _: self.changed.emit())
        self.verdict_label = QLabel("", wordWrap=True)
        form = QFormLayout()
        form.addRow("Target", self.target_choice)
        form.addRow("Drafts from", self.drafter_choice)
        form.addRow("Images", self.projector_choice)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(form)
        layout.addWidget(self.verdict_label)

    def picked(self) -> PickedPair | None:
        """The pair chosen, or None without a target."""
        target, drafter = self.target_choice.currentData(), self.drafter_choice.currentData()
        if not target:
            return None
        draft = drafter if drafter not in (NGRAM, NO_DRAFT) else None
        return PickedPair(str(target), draft, drafter == NGRAM, self.projector_choice.currentData())

    def choose(
        self, target: str | Path, drafter: str | Path | None = None, mmproj: str | Path | None = None
    ) -> None:
        """Pick the target, the drafter (a path, "ngram", or "none") and a vision projector to load."""
        self.want(
            {
                "target": str(target),
                "drafter": str(drafter) if drafter else NGRAM,
                "mmproj": str(mmproj) if mmproj else None,
            }
        )
        self.fill()

    def want(self, paths: dict[str, str | None]) -> None:
        """Choose these ("target", and "drafter" and "mmproj" where given) as soon as the list of local
        files holds them (a file just imported or downloaded shows after the next scan)."""
        self._wanted = paths

    def fill(self) -> None:
        """List the local files again, keeping the choice (or taking the one wanted)."""
        wanted = self._wanted or {}
        target = wanted.get("target") or self.target_choice.currentData()
        drafter = wanted.get("drafter") or self.drafter_choice.currentData() or NGRAM
        projector = wanted.get("mmproj", self.projector_choice.currentData()) if wanted else None
        models = self.local.usable()
        for combo in (self.target_choice, self.drafter_choice, self.projector_choice):
            combo.blockSignals(True)
            combo.clear()
        self.projector_choice.addItem("no vision projector (text only)", None)
        for m in self.local.projectors():
            self.projector_choice.addItem(f"{m.path.name} ({m.size / 2**20:.0f} MiB)", str(m.path))
        index = self.projector_choice.findData(projector) if projector else 0
        self.projector_choice.setCurrentIndex(max(index, 0))
        self.projector_choice.blockSignals(False)
        self.drafter_choice.addItem("n-gram lookup in the conversation (no drafter model)", NGRAM)
        self.drafter_choice.addItem("nothing (plain decoding)", NO_DRAFT)
        for m in models:
            label = f"{m.path.name} ({m.architecture}, {m.size / 2**30:.2f} GiB)"
            self.target_choice.addItem(label, str(m.path))
            self.drafter_choice.addItem(label, str(m.path))
        for combo, value in ((self.target_choice, target), (self.drafter_choice, drafter)):
            index = combo.findData(value) if value else -1
            combo.setCurrentIndex(index if index >= 0 else 0)
            combo.blockSignals(False)
        if self.target_choice.currentData() == wanted.get("target"):
            self._wanted = None  # else kept until a scan shows the file (a download just finished)
        self._pair_changed()

    def wait(self, timeout: float | None = None) -> None:
        """Join the verdicts being read."""
        self.jobs.wait(timeout)

    def _pair_changed(self) -> None:
        target, drafter = self.target_choice.currentData(), self.drafter_choice.currentData()
        self.verdict = None
        if not target:
            self.verdict_label.setText("Import or download a model to load it.")
        elif drafter == NGRAM:
            self.verdict_label.setText(
                "N-gram drafting needs no drafter model: it looks up the conversation."
            )
        elif drafter == NO_DRAFT:
            self.verdict_label.setText("Plain decoding: no speculation.")
        elif drafter == target:
            self.verdict_label.setText("The drafter is the target itself: pick a smaller model.")
        else:
            self.verdict_label.setText("Reading both headers…")
            job = self.jobs.job(lambda: read_verdict(Path(target), Path(drafter)))
            job.done.connect(lambda verdict, t=target, d=drafter: self._verdict(t, d, verdict))
            job.failed.connect(lambda message: self.verdict_label.setText(f"No verdict: {message}"))
            job.start()
        self.changed.emit()

    def _verdict(self, target: str, drafter: str, verdict: Verdict) -> None:
        if (target, drafter) != (self.target_choice.currentData(), self.drafter_choice.currentData()):
            return  # the choice changed while the headers were read
        self.verdict = verdict
        self.verdict_label.setText(verdict.summary())
        self.verdict_label.setToolTip(
            "\n".join(f"{'pass' if r.passed else 'FAIL'}  {r.name}: {r.detail}" for r in verdict.rules)
        )
