"""An engine's report for /props: the models, where they run and why, drafting, vision and batching."""

from __future__ import annotations

from typing import Any

from app.engine.batching import Scheduler
from app.engine.loading import LoadedPair
from app.engine.slots import Slots


def engine_props(
    pair: LoadedPair, scheduler: Scheduler, slots: Slots, placement: dict[str, Any] | None
) -> dict[str, Any]:
    """What was loaded and why, how requests run (`scheduler` over `slots`), and where the engine process
    placed the pair (`placement`, None: not placed by one)."""
    t = pair.target
    out: dict[str, Any] = {
        "target": {
            "path": t.facts.path,
            "name": t.facts.name,
            "architecture": t.facts.architecture,
            "parameters": t.facts.n_params,
            "weights_bytes": t.facts.weights_bytes,
            "kv_bytes_per_token": t.facts.kv_bytes_per_token,
            "n_ctx": t.n_ctx,
            "n_ctx_train": t.facts.n_ctx_train,
            "device": t.facts.device,
            "device_reason": t.device_reason,
            "gpu_layers": t.facts.gpu_layers,
            "n_layer": t.facts.n_layer,
            "main_gpu": t.main_gpu,
            "tensor_split": t.tensor_split,
            "threads": t.n_threads,
            "backend": t.backend_name,
            "backend_reason": pair.backend_reason,
            "backend_choice": pair.backend_choice.as_dict() if pair.backend_choice else None,
        },
        "chat_template": pair.chat.source,
        "capabilities": {
            "tools": pair.chat.tool_format is not None,
            "tool_call_format": pair.chat.tool_format,
            "fill_in_the_middle": t.fim_tokens() is not None,
        },
        "draft": {
            "source": pair.drafter.source if pair.drafter else "none",
            "choice": pair.choice.describe(pair.drafter, pair.policy),
        },
        "vision": pair.vision is not None,
        "placement": placement,
        "batching": _batching(pair, scheduler, slots),
    }
    if pair.vision is not None:
        # A drafter model cannot see images: image prompts draft by n-gram lookup or not at all.
        image_mode = "ngram" if pair.drafter is not None and pair.drafter.source == "ngram" else "plain"
        out["projector"] = {**pair.vision.info(), "image_draft_mode": image_mode}
    if pair.draft_model is not None:
        out["draft"].update(
            path=pair.draft_model.facts.path,
            name=pair.draft_model.facts.name,
            device=pair.draft_model.facts.device,
            backend=pair.draft_model.backend_name,
            backend_reason=pair.draft_backend_reason,
            gpu_layers=pair.draft_model.facts.gpu_layers,
            main_gpu=pair.draft_model.main_gpu,
            cost_per_token_ms=round(pair.drafter.cost_per_token_s * 1e3, 3) if pair.drafter else None,
        )
    if pair.vocab_verdict is not None:
        v = pair.vocab_verdict
        out["draft"]["vocabulary"] = {
            "compatible": v.compatible,
            "target_size": v.target_size,
            "drafter_size": v.drafter_size,
            "first_mismatch_id": v.first_mismatch_id,
            "reasons": v.reasons,
            "summary": v.summary(),
        }
    if pair.policy is not None and pair.costs is not None:
        k, gain = pair.policy.best()
        out["draft"]["policy"] = {
            "max_draft": pair.policy.max_draft,
            "adaptive": pair.policy.adaptive,
            "verify_cost_ms": [round(s * 1e3, 3) for s in pair.costs.seconds],
            "verify_cost_relative": pair.costs.relative(),
            "switch_penalty_ms": [round(s * 1e3, 3) for s in pair.costs.switch or []],
            "acceptance_estimate": [round(a, 3) for a in pair.policy.acceptance()],
            "best_draft_length": k,
            "expected_speedup": round(gain, 3),
        }
    return out


def _batching(pair: LoadedPair, scheduler: Scheduler, slots: Slots) -> dict[str, Any]:
    """How concurrent requests run."""
    if not scheduler.batched:
        one = pair.one_slot_reason if pair.target.backend_name == "llama" else ""
        one = one or f"the {pair.target.backend_name} backend keeps one sequence here"
        why = f"{one}: requests run one at a time"
    else:
        why = (
            "continuous batching over llama.cpp sequences: the open streams' tokens and n-gram drafts go "
            "in one decode per step; a stream that starts alone drafts with the engine's drafter, those "
            "that join it with their own n-gram lookup; a request with a seed (sampled) runs alone, in a "
            "cache emptied of other slots, and decodes plainly, so that its text does not depend on them"
        )
    return {
        "slots": len(slots.slots),
        "batched": scheduler.batched,
        "reason": why,
        "batch_steps": scheduler.batch_steps,
    }
