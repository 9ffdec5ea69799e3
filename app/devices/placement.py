"""Placement: where the target and drafter go and at what context; a pure function of devices and a need."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.catalog import fit, gguf
from app.catalog.fit import CONTEXT_TIERS as FIT_TIERS
from app.catalog.fit import GIB, PairNeed
from app.config import Settings
from app.devices import probe
from app.devices.probe import NOT_IN_BUILD, Device

BUSY_UTILISATION = 50  # percent; above it a device is someone else's
# automatic placement sizes the context up to 32k; larger contexts are an explicit choice
CONTEXT_TIERS = tuple(c for c in FIT_TIERS if c <= 32768)


@dataclass(frozen=True)
class UserChoice:
    """Explicit settings; each one set wins over the automatic choice."""

    device: str = "auto"  # auto, cpu, gpu, gpu:N
    draft_device: str = "auto"
    tensor_split: tuple[float, ...] | None = None
    n_ctx: int = 0  # 0: sized from free memory


@dataclass
class Placement:
    device: str  # cpu, gpu:N, or "gpu" with a tensor_split
    draft_device: str
    tensor_split: list[float] | None
    n_ctx: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(d: Device) -> str:
    return "cpu" if not d.is_gpu else f"gpu:{d.index}"


def _usable(d: Device) -> tuple[bool, str]:
    if NOT_IN_BUILD in d.flags:
        return False, f"{d.name} is {NOT_IN_BUILD}"
    if d.busy_percent is not None and d.busy_percent > BUSY_UTILISATION:
        return False, f"{d.name} is busy ({d.busy_percent:.0f}% used)"
    return True, ""


def _contexts(n_ctx: int, need: PairNeed) -> list[int]:
    if n_ctx:
        return [n_ctx]
    limit = need.target.context_length or CONTEXT_TIERS[0]
    tiers = [c for c in CONTEXT_TIERS if c <= limit]
    return tiers or [limit]


def place(devices: list[Device], need: PairNeed, user: UserChoice | None = None) -> Placement:
    """Where the target and drafter go, at what context length, and why.

    The strategy is chosen at the smallest context tier (a GPU that holds everything, then target and
    drafter apart, then a split target, then the CPU); the context is then the largest tier it still fits.
    """
    user = user or UserChoice()
    contexts = _contexts(user.n_ctx, need)
    cpu = next((d for d in devices if d.kind == "cpu"), None)
    notes: list[str] = []
    gpus = []
    for d in devices:
        if not d.is_gpu:
            continue
        ok, why = _usable(d)
        if ok:
            gpus.append(d)
        else:
            notes.append(why)
    gpus.sort(key=lambda d: (d.kind != "discrete", -d.free_bytes))
    suffix = f"; skipped {', '.join(notes)}" if notes else ""
    has_draft = need.drafter is not None

    if user.device != "auto" or user.draft_device != "auto" or user.tensor_split:
        device = user.device if user.device != "auto" else (_label(gpus[0]) if gpus else "cpu")
        draft = user.draft_device if user.draft_device != "auto" else device
        split = list(user.tensor_split) if user.tensor_split else None
        if user.n_ctx:
            return Placement(device, draft, split, user.n_ctx, "explicit user choice" + suffix)
        # the context is still ours to size: the largest tier the chosen device holds
        if device == "cpu":
            free = cpu.free_bytes if cpu is not None else 0
        elif device == "gpu" and split:
            free = sum(g.free_bytes for g in gpus)
        else:
            index = int(device.partition(":")[2] or 0) if device.startswith("gpu") else -1
            free = next((g.free_bytes for g in gpus if g.index == index), 0)
        n_ctx = next((c for c in contexts if need.total(c) <= free), contexts[-1])
        return Placement(device, draft, split, n_ctx, f"explicit user choice; context {n_ctx:,} fits{suffix}")

    def one_gpu(n_ctx: int, gpus: list[Device]) -> Placement | None:
        for g in gpus:
            if need.total(n_ctx) <= g.free_bytes:
                what = "target and drafter" if has_draft else "the model"
                return Placement(
                    _label(g), _label(g), None, n_ctx,
                    f"{g.name} ({g.kind}) holds {what} "
                    f"({need.total(n_ctx) / GIB:.1f} of {g.free_bytes / GIB:.1f} GiB free){suffix}",
                )  # fmt: skip
        return None

    def apart(n_ctx: int, gpus: list[Device]) -> Placement | None:
        target_need = need.with_margin(need.target_bytes(n_ctx))
        draft_need = need.with_margin(need.drafter_bytes(n_ctx))
        for g in gpus:
            if not has_draft or target_need > g.free_bytes:
                continue
            for o in gpus:
                if o is not g and draft_need <= o.free_bytes:
                    return Placement(
                        _label(g), _label(o), None, n_ctx,
                        f"target on {g.name}, drafter on {o.name}: together they fit no single GPU{suffix}",
                    )  # fmt: skip
            return Placement(
                _label(g), "cpu", None, n_ctx,
                f"target on {g.name}, drafter on the CPU: together they do not fit the GPU{suffix}",
            )  # fmt: skip
        return None

    def split(n_ctx: int, gpus: list[Device]) -> Placement | None:
        free = sum(g.free_bytes for g in gpus)
        if len(gpus) < 2 or need.with_margin(need.target_bytes(n_ctx)) > free:
            return None
        ratios = [0.0] * (max(g.index for g in gpus) + 1)
        for g in gpus:
            ratios[g.index] = round(g.free_bytes / free, 3)
        names = " + ".join(g.name for g in gpus)
        return Placement(
            "gpu", "cpu" if has_draft else "gpu", ratios, n_ctx,
            f"target split over {names} by free memory: no single GPU holds it{suffix}",
        )  # fmt: skip

    def on_cpu(n_ctx: int, gpus: list[Device]) -> Placement | None:
        if cpu is not None and need.total(n_ctx) > cpu.free_bytes and n_ctx != contexts[-1]:
            return None
        why = "no GPU found" if not gpus and not notes else "no usable GPU holds the model"
        if cpu is not None and need.total(n_ctx) > cpu.free_bytes:
            why += f", and RAM is short too ({cpu.free_bytes / GIB:.1f} GiB free)"
        return Placement("cpu", "cpu", None, n_ctx, f"CPU: {why}{suffix}")

    for strategy in (one_gpu, apart, split, on_cpu):
        first = strategy(contexts[-1], gpus)
        if first is None:
            continue
        # Size the context on the devices chosen at the smallest tier (a discrete GPU at 16k beats an
        # integrated one at 32k).
        chosen = [g for g in gpus if _label(g) in (first.device, first.draft_device)] or gpus
        if first.tensor_split:
            chosen = gpus
        for n_ctx in contexts:
            placed = strategy(n_ctx, chosen)
            if placed is not None:
                return placed
    raise AssertionError("on_cpu always places at the smallest context")


def need_of(
    target: str | Path, draft: str | Path | None = None, mmproj: str | Path | None = None
) -> PairNeed:
    """What a pair needs, read from the GGUF headers (never the weights)."""
    drafter = fit.read_shape(draft) if draft else None
    mmproj_bytes = Path(mmproj).stat().st_size if mmproj and Path(mmproj).is_file() else 0
    return PairNeed(fit.read_shape(target), drafter, mmproj_bytes)


def user_choice(settings: Settings) -> UserChoice:
    es = settings.engine
    split = tuple(es.tensor_split) if es.tensor_split else None
    return UserChoice(es.device, es.draft_device, split, es.n_ctx)


def is_automatic(settings: Settings) -> bool:
    """Whether anything is left for placement to decide (a device or the context set to auto)."""
    choice = user_choice(settings)
    return choice.n_ctx == 0 or (
        choice.device == "auto" and choice.draft_device == "auto" and not choice.tensor_split
    )


def apply(settings: Settings, placed: Placement) -> Settings:
    """Settings with the placement's devices, split and context filled in (explicit values were kept
    by `place` itself, so this only fills what was automatic)."""
    engine = settings.engine.model_copy(
        update={
            "device": placed.device,
            "draft_device": placed.draft_device,
            "tensor_split": placed.tensor_split,
            "n_ctx": placed.n_ctx,
        }
    )
    return settings.model_copy(update={"engine": engine})


def settle(
    settings: Settings,
    target: str | Path,
    draft: str | Path | None = None,
    devices: list[Device] | None = None,
) -> tuple[Settings, Placement | None]:
    """What the engine process runs with: the placement applied where a device or the context is left
    automatic (devices discovered in child processes unless given), the settings unchanged otherwise."""
    if not is_automatic(settings):
        return settings, None
    if devices is None:
        devices = probe.discover(paths=probe.PLACEMENT_PROBES).devices()
    drafter = draft if settings.draft.mode in ("auto", "model") else None
    try:
        need = need_of(target, drafter, settings.engine.mmproj)
    except (gguf.GGUFError, OSError, ValueError):
        return settings, None  # unreadable: the load that follows fails with the file's name and why
    placed = place(devices, need, user_choice(settings))
    return apply(settings, placed), placed


def describe(placed: Placement | None) -> dict[str, Any]:
    """The placement as /props reports it."""
    return placed.as_dict() if placed is not None else {"reason": "devices and context set explicitly"}
