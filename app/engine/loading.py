"""Loading a pair: the target on its backend, its chat format and projector, the drafter and its policy."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from app import paths
from app.config import ConfigError, DraftSettings, Settings
from app.engine.backends.base import UNPLACED_N_CTX, Backend
from app.engine.backends.choice import BackendChoice, choose_backend
from app.engine.backends.llama import LlamaBackend
from app.engine.backends.native import MAX_WIDTH as NATIVE_MAX_WIDTH
from app.engine.backends.native import NativeBackend, native_support
from app.engine.chat import ChatFormat
from app.engine.drafting.calibration import VerifyCosts, cost_key, measure_token_cost, measure_verify_costs
from app.engine.drafting.choice import DraftChoice
from app.engine.drafting.drafters import (
    CrossVocabDrafter,
    Drafter,
    ModelDrafter,
    NgramDrafter,
    VocabVerdict,
    check_drafter_usable,
    check_vocab,
)
from app.engine.drafting.policy import TRIAL_STEPS, DraftPolicy
from app.engine.drafting.step import Speculation
from app.engine.errors import DrafterUnusable, ModelLoadError
from app.engine.vision import Vision

log = logging.getLogger("foresight.engine")


@dataclass(frozen=True)
class LoadedPair:
    """What an engine runs, and why: the target and its backend, its chat format and projector, the
    drafter model and the draft source made of it, the verify costs and the draft policy."""

    target: Backend
    backend_reason: str  # why the target runs on its backend
    backend_choice: BackendChoice | None  # auto's measured choice for the target
    one_slot_reason: str  # why a llama.cpp target keeps one sequence ("": it keeps several)
    chat: ChatFormat
    vision: Vision | None = None
    draft_model: Backend | None = None
    draft_backend_reason: str = ""
    draft_chat: ChatFormat | None = None  # the drafter model's own format, where it drafts through text
    vocab_verdict: VocabVerdict | None = None
    drafter: Drafter | None = None
    costs: VerifyCosts | None = None
    policy: DraftPolicy | None = None
    choice: DraftChoice = field(default_factory=DraftChoice)

    def close(self) -> None:
        """Free the projector and the models (again: nothing more happens)."""
        for model in (self.vision, self.draft_model, self.target):
            if model is not None:
                model.close()


def check_settings(settings: Settings) -> None:
    """Settings that cannot work together, refused before anything loads."""
    es, ds = settings.engine, settings.draft
    if ds.mode != "none" and es.n_batch < ds.max_draft + 1:
        raise ConfigError(
            f"engine.n_batch {es.n_batch} is smaller than draft.max_draft + 1 = {ds.max_draft + 1}: a verify "
            "pass takes a draft and the token before it at once; raise n_batch or lower max_draft"
        )


def sized(settings: Settings | None) -> Settings:
    """The settings with a context: where no engine process's placement sized it, UNPLACED_N_CTX."""
    settings = settings or Settings()
    if settings.engine.n_ctx == 0:
        engine = settings.engine.model_copy(update={"n_ctx": UNPLACED_N_CTX})
        settings = settings.model_copy(update={"engine": engine})
    return settings


def verify_width(ds: DraftSettings) -> int:
    """The widest pass of a step: a whole draft and the token before it (1: no drafting)."""
    return ds.max_draft + 1 if ds.mode != "none" else 1


def lookup(ds: DraftSettings) -> NgramDrafter:
    """An n-gram prompt lookup of the sizes the settings give."""
    return NgramDrafter(ds.ngram_min, max(ds.ngram_min, ds.ngram_max))


def slot_count(settings: Settings) -> tuple[int, str]:
    """KV sequences of a llama.cpp target, and why it keeps only one where it does ("" where not)."""
    es = settings.engine
    width = verify_width(settings.draft)
    n_seq = max(1, min(es.slots, es.n_batch // width))  # a step verifies every stream's draft in one pass
    if es.slots == 1:
        return n_seq, "engine.slots is 1"
    if n_seq == 1:
        return n_seq, f"engine.n_batch {es.n_batch} holds one stream's verify pass of {width} tokens"
    return n_seq, ""


def load_pair(
    target: Path, draft: Path | None, settings: Settings, report: Callable[[str], None]
) -> LoadedPair:
    """The target (and drafter) as `settings` ask (sized: see `sized`). `report` hears each stage by name
    (loading target, loading projector, loading drafter, calibrating); it may raise to abandon the load.
    Whatever fails, what was loaded is closed."""
    check_settings(settings)
    es = settings.engine
    with ExitStack() as loaded:
        report("loading target")
        n_seq, one_slot_reason = slot_count(settings)
        model, backend_reason, backend_choice = _load_target(target, settings, n_seq)
        loaded.callback(model.close)
        chat = ChatFormat(model.chat_template, model.facts.architecture)
        vision = None
        if es.mmproj:
            report("loading projector")
            vision = Vision(es.mmproj, model)
            loaded.callback(vision.close)
        pair = LoadedPair(model, backend_reason, backend_choice, one_slot_reason, chat, vision)
        pair = _with_drafting(pair, draft, settings, report, loaded)
        loaded.pop_all()
    return pair


def _with_drafting(
    pair: LoadedPair, draft: Path | None, settings: Settings, report: Callable[[str], None], loaded: ExitStack
) -> LoadedPair:
    """The pair with the draft source the settings ask for, its verify costs and its policy."""
    es, ds = settings.engine, settings.draft
    mode = ds.mode
    if mode == "auto":
        mode = "model" if draft else "ngram"
    if mode == "model":
        if not draft:
            raise DrafterUnusable("draft mode 'model' needs a drafter model file")
        report("loading drafter")
        pair = _with_drafter_model(pair, draft, settings, loaded)
    elif mode == "ngram":
        pair = dataclasses.replace(pair, drafter=lookup(ds))
    drafter, target = pair.drafter, pair.target
    if drafter is None:
        return pair
    report("calibrating")
    costs = measure_verify_costs(
        target,
        ds.max_draft + 1,
        paths.cache_dir() / "verify-costs.json",
        cost_key(target, es.flash_attn),
        shape_sensitive=target.facts.device == "gpu",
    )
    model = drafter.source != "ngram"
    policy = DraftPolicy(
        costs,
        ds.max_draft,
        drafter.cost_per_token_s,
        ds.adaptive,
        trial_steps=TRIAL_STEPS if model else 0,
    )
    choice = DraftChoice()
    if model and ds.adaptive:  # where the drafter model's trial fails, lookups draft
        choice = DraftChoice(Speculation(lookup(ds), DraftPolicy(costs, ds.max_draft, 0.0)))
    return dataclasses.replace(pair, costs=costs, policy=policy, choice=choice)


def _with_drafter_model(pair: LoadedPair, path: Path, settings: Settings, loaded: ExitStack) -> LoadedPair:
    target = pair.target
    try:
        model, reason = _load_draft_model(path, settings, target.n_ctx)
    except ModelLoadError as exc:
        raise DrafterUnusable(f"the drafter cannot be used: {exc}") from exc
    loaded.callback(model.close)
    check_drafter_usable(model)
    verdict = check_vocab(target, model)
    cost, prefill = measure_token_cost(model)
    log.info("drafter %s: %s", path.name, verdict.summary())
    pair = dataclasses.replace(pair, draft_model=model, draft_backend_reason=reason, vocab_verdict=verdict)
    if verdict.compatible:
        return dataclasses.replace(pair, drafter=ModelDrafter(model, cost, prefill))
    return dataclasses.replace(
        pair,
        draft_chat=ChatFormat(model.chat_template, model.facts.architecture),
        drafter=CrossVocabDrafter(model, target, verdict, cost, prefill),
    )


# --- which backend runs a model ------------------------------------------------------------------------
def native_refusal(
    path: Path, choice: str, setting: str, device: str, limit: str | None = None
) -> str | None:
    """Why the native backend cannot run this model as the settings place it (None: it can). `choice` is
    the backend setting (auto, llama, native), `device` the device setting named `setting`, `limit` a
    reason the caller's other settings give."""
    place = device.strip().lower()
    if choice == "llama":
        return "not asked for"
    if place == "cpu":
        return "the settings ask for the CPU"
    if ":" in place:
        return f"{setting} {device!r}: the native backend runs on the current GPU only"
    return limit or native_support(path)


def native_or_why_not(
    path: Path, choice: str, refusal: str | None, n_ctx: int
) -> tuple[NativeBackend | None, str]:
    """The model on our kernels where `choice` and `refusal` allow, with the reason to report; or None and
    why llama.cpp runs it. Where native was asked for and cannot run, ModelLoadError says why."""
    if choice == "native" and refusal:
        raise ModelLoadError(f"the native backend cannot run {path.name}: {refusal}")
    if choice != "llama" and not refusal:
        try:
            return NativeBackend(path, n_ctx=n_ctx), "our kernels run this model on this GPU"
        except ModelLoadError as exc:
            if choice == "native":
                raise
            refusal = str(exc)
    return None, "llama.cpp, as the settings ask" if choice == "llama" else f"llama.cpp: {refusal}"


def _target_refusal(path: Path, settings: Settings) -> str | None:
    """Why the native backend cannot take this target with these settings (None: it can)."""
    es, ds = settings.engine, settings.draft
    if ds.mode != "none" and ds.max_draft + 1 > NATIVE_MAX_WIDTH:
        limit = f"drafts of {ds.max_draft} tokens: its passes take at most {NATIVE_MAX_WIDTH} tokens"
    elif es.mmproj:
        limit = "images go through libmtmd, which needs the model in llama.cpp"
    elif es.tensor_split or es.gpu_layers != -1:
        limit = "a split or partial offload of the model"
    else:
        limit = None
    return native_refusal(path, es.backend, "device", es.device, limit)


def _load_target(path: Path, settings: Settings, n_seq: int) -> tuple[Backend, str, BackendChoice | None]:
    """The target on the backend the settings ask for, why there, and auto's measured choice (if made):
    `auto` takes the native one where it can run and serves sooner than llama.cpp."""
    es = settings.engine
    native, reason = native_or_why_not(path, es.backend, _target_refusal(path, settings), es.n_ctx)

    def llama() -> Backend:
        return LlamaBackend(path, es, n_seq=n_seq)

    if native is None:
        return llama(), reason, None
    if es.backend == "native":
        return native, reason, None
    # auto: our kernels only where they serve this model sooner than llama.cpp, as timed on this device
    model, choice = choose_backend(
        native,
        lambda: NativeBackend(path, n_ctx=es.n_ctx),
        llama,
        width=verify_width(settings.draft),
        settings=f"b{es.n_batch}:fa-{es.flash_attn}:argmax-{es.device_argmax}",
    )
    return model, choice.reason, choice


def _load_draft_model(path: Path, settings: Settings, n_ctx: int) -> tuple[Backend, str]:
    """The drafter on the backend the settings ask for, in the target's context of n_ctx, and why there."""
    es = settings.engine
    refusal = native_refusal(path, es.draft_backend, "draft device", es.draft_device)
    native, reason = native_or_why_not(path, es.draft_backend, refusal, n_ctx)
    if native is not None:
        return native, reason
    return LlamaBackend(path, es.model_copy(update={"n_ctx": n_ctx}), role="draft"), reason
