"""Placement: where the target and drafter go and at what context; a pure function of devices and a need,
and its application in the engine process, where the RPC workers' devices join first."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.addresses import parse_endpoints
from app.catalog import fit, gguf
from app.catalog.fit import CONTEXT_TIERS as FIT_TIERS
from app.catalog.fit import GIB, PairNeed
from app.config import ConfigError, Settings
from app.devices import child, remote, rpc
from app.devices.found import NOT_IN_BUILD, Device

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
    tensor_split: list[float] | None  # with remote devices: theirs first, then this machine's GPUs
    n_ctx: int
    reason: str
    gpu_layers: int = -1  # layers off the CPU (-1: all); the rest stays on this machine's CPU
    remote: list[str] = field(default_factory=list)  # the remote devices that take layers

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
    workers = [d for d in devices if d.is_remote]
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
        split = list(user.tensor_split) if user.tensor_split else None
        if split and user.device == "auto" and (gpus or workers):
            device = "gpu"  # a split is over devices, the workers' included
        draft = user.draft_device if user.draft_device != "auto" else device
        if workers and draft == "gpu":  # the drafter stays on this machine, next to the user
            draft = _label(gpus[0]) if gpus else "cpu"
        if user.n_ctx:
            return Placement(device, draft, split, user.n_ctx, "explicit user choice" + suffix)
        # the context is still ours to size: the largest tier the chosen device holds
        if device == "cpu":
            free = cpu.free_bytes if cpu is not None else 0
        elif device == "gpu" and split:
            free = sum(g.free_bytes for g in [*gpus, *workers])
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

    def spread(n_ctx: int, gpus: list[Device]) -> Placement | None:
        """The target over the RPC workers' devices (first, as llama.cpp orders them) and this machine's
        GPUs by free memory; what they cannot hold stays on this CPU. The drafter stays here."""
        if not workers:
            return None
        free = sum(d.free_bytes for d in [*workers, *gpus])
        ratios = [d.free_bytes / free for d in workers]
        local = [0.0] * (max((g.index for g in gpus), default=-1) + 1)  # by llama.cpp's GPU index
        for g in gpus:
            local[g.index] = g.free_bytes / free
        names = " + ".join(d.name for d in [*workers, *gpus])
        target = need.with_margin(need.target_bytes(n_ctx))
        layers, note = -1, "holds the target"
        if target > free:  # the layers that fit there; the rest on this CPU, if it holds them
            n_layer = need.target.n_layer + 1  # the output layer counts as llama.cpp counts it
            layers = int(n_layer * free / target)
            here = need.target_bytes(n_ctx) * (n_layer - layers) // n_layer + need.drafter_bytes(n_ctx)
            if layers < 1 or (cpu is not None and need.with_margin(here) > cpu.free_bytes):
                return None
            note = f"takes {layers} of {n_layer} layers, the rest on this CPU"
        return Placement(
            "gpu", "cpu", [round(r, 3) for r in [*ratios, *local]], n_ctx,
            f"target over {names} by free memory: {note} (each token crosses the network){suffix}",
            layers, [d.name for d in workers],
        )  # fmt: skip

    def on_cpu(n_ctx: int, gpus: list[Device]) -> Placement | None:
        if cpu is not None and need.total(n_ctx) > cpu.free_bytes and n_ctx != contexts[-1]:
            return None
        why = "no GPU found" if not gpus and not notes else "no usable GPU holds the model"
        if cpu is not None and need.total(n_ctx) > cpu.free_bytes:
            why += f", and RAM is short too ({cpu.free_bytes / GIB:.1f} GiB free)"
        return Placement("cpu", "cpu", None, n_ctx, f"CPU: {why}{suffix}")

    for strategy in (one_gpu, apart, split, spread, on_cpu):
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
    update: dict[str, Any] = {
        "device": placed.device,
        "draft_device": placed.draft_device,
        "tensor_split": placed.tensor_split,
        "n_ctx": placed.n_ctx,
    }
    if placed.gpu_layers != -1 and settings.engine.gpu_layers == -1:
        update["gpu_layers"] = placed.gpu_layers
    engine = settings.engine.model_copy(update=update)
    return settings.model_copy(update={"engine": engine})


@dataclass
class RemoteUse:
    """This process's RPC workers: joined (their devices in llama.cpp's registry, for good), or left out."""

    servers: str  # as configured, host:port,...
    devices: list[Device] = field(default_factory=list)
    local_gpus: list[str] = field(default_factory=list)  # this machine's, in llama.cpp's registry
    off: str = ""  # why they were left out; "" when they joined

    def as_dict(self) -> dict[str, Any]:
        return {
            "servers": self.servers.split(","),
            "state": "off" if self.off else "joined",
            "reason": self.off,
            "devices": [
                {"name": d.name, "endpoint": d.endpoint, "free_bytes": d.free_bytes,
                 "total_bytes": d.total_bytes, "latency_ms": d.latency_ms}
                for d in self.devices
            ],
        }  # fmt: skip


_remote: RemoteUse | None = None  # joined devices stay registered for the life of the process
_remote_off = ""


def leave_out_remote(reason: str) -> None:
    """Keep the RPC workers out of this process whatever the settings say (an engine started again on
    this machine's devices after a worker was lost); /props gives the reason."""
    global _remote_off
    _remote_off = reason


def join_remote(settings: Settings) -> tuple[Settings, list[Device]]:
    """The workers of `[engine] rpc` joined to this process, and the settings to place with: left out (see
    leave_out_remote), a split or layer count meant for them is dropped and placement decides again."""
    global _remote
    servers = settings.engine.rpc
    if not servers:
        return settings, []
    if _remote_off:
        _remote = RemoteUse(servers, off=_remote_off)
        es = settings.engine
        local: dict[str, Any] = {"tensor_split": None, "gpu_layers": -1}
        if es.device == "gpu":  # a split that reached the workers: this machine's devices are placed anew
            local["device"] = "auto"
        settings = settings.model_copy(update={"engine": es.model_copy(update=local)})
        return settings, []
    try:
        joined, here = remote.attach(parse_endpoints(servers))
    except rpc.RemoteError as exc:  # named before llama.cpp would abort the process on it
        raise ConfigError(f"rpc: {exc}") from exc
    _remote = RemoteUse(servers, joined, here)
    return settings, joined


def _drafter_here(settings: Settings) -> Settings:
    """A drafter left to spread (auto, gpu) would cross the network with the target: it stays here."""
    es = settings.engine
    if _remote is None or _remote.off or not _remote.devices or es.draft_device not in ("auto", "gpu"):
        return settings
    here = "gpu:0" if _remote.local_gpus else "cpu"
    return settings.model_copy(update={"engine": es.model_copy(update={"draft_device": here})})


def settle(
    settings: Settings,
    target: str | Path,
    draft: str | Path | None = None,
    devices: list[Device] | None = None,
) -> tuple[Settings, Placement | None]:
    """What the engine process runs with: the RPC workers joined first (rpc.RemoteError names one that cannot
    serve), then the placement applied where a device or the context is left automatic (devices
    discovered in child processes unless given), the settings unchanged otherwise."""
    settings, workers = join_remote(settings)
    if not is_automatic(settings):
        return _drafter_here(settings), None
    if devices is None:
        devices = child.discover(paths=child.PLACEMENT_PROBES).devices()
        devices = [d for d in devices if not d.is_remote] + workers
    drafter = draft if settings.draft.mode in ("auto", "model") else None
    try:
        need = need_of(target, drafter, settings.engine.mmproj)
    except (gguf.GGUFError, OSError, ValueError):
        return settings, None  # unreadable: the load that follows fails with the file's name and why
    placed = place(devices, need, user_choice(settings))
    return apply(settings, placed), placed


def describe(placed: Placement | None) -> dict[str, Any]:
    """The placement as /props reports it, with the RPC workers where any were configured."""
    out = placed.as_dict() if placed is not None else {"reason": "devices and context set explicitly"}
    if _remote is not None:
        out["rpc"] = _remote.as_dict()
    return out
