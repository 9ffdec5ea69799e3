"""An Engine's report for /props: the models, where they run and why, drafting, vision and batching."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.engine.engine import Engine


def engine_props(engine: Engine) -> dict[str, Any]:
    t = engine.target
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
            "backend_reason": engine.backend_reason,
            "backend_choice": engine.backend_choice.as_dict() if engine.backend_choice else None,
        },
        "chat_template": engine.chat.source,
        "capabilities": {
            "tools": engine.chat.tool_format is not None,
            "tool_call_format": engine.chat.tool_format,
            "fill_in_the_middle": t.fim_tokens() is not None,
        },
        "draft": {
            "source": engine.drafter.source if engine.drafter else "none",
            "choice": engine.choice.describe(engine.drafter, engine.policy),
        },
        "vision": engine.vision is not None,
        "placement": engine.placement,
        "batching": _batching(engine),
    }
    if engine.vision is not None:
        # A drafter model cannot see images: image prompts draft by n-gram lookup or not at all.
        image_mode = "ngram" if engine.drafter is not None and engine.drafter.source == "ngram" else "plain"
        out["projector"] = {**engine.vision.info(), "image_draft_mode": image_mode}
    if engine.draft_model is not None:
        out["draft"].update(
            path=engine.draft_model.facts.path,
            name=engine.draft_model.facts.name,
            device=engine.draft_model.facts.device,
            backend=engine.draft_model.backend_name,
            backend_reason=engine.draft_backend_reason,
            gpu_layers=engine.draft_model.facts.gpu_layers,
            main_gpu=engine.draft_model.main_gpu,
            cost_per_token_ms=round(engine.drafter.cost_per_token_s * 1e3, 3) if engine.drafter else None,
        )
    if engine.vocab_verdict is not None:
        v = engine.vocab_verdict
        out["draft"]["vocabulary"] = {
            "compatible": v.compatible,
            "target_size": v.target_size,
            "drafter_size": v.drafter_size,
            "first_mismatch_id": v.first_mismatch_id,
            "reasons": v.reasons,
            "summary": v.summary(),
        }
    if engine.policy is not None and engine.costs is not None:
        k, gain = engine.policy.best()
        out["draft"]["policy"] = {
            "max_draft": engine.policy.max_draft,
            "adaptive": engine.policy.adaptive,
            "verify_cost_ms": [round(s * 1e3, 3) for s in engine.costs.seconds],
            "verify_cost_relative": engine.costs.relative(),
            "switch_penalty_ms": [round(s * 1e3, 3) for s in engine.costs.switch or []],
            "acceptance_estimate": [round(a, 3) for a in engine.policy.acceptance()],
            "best_draft_length": k,
            "expected_speedup": round(gain, 3),
        }
    return out


def _batching(engine: Engine) -> dict[str, Any]:
    """How concurrent requests run."""
    scheduler = engine.scheduler
    if not scheduler.batched:
        one = engine.one_slot_reason if engine.target.backend_name == "llama" else ""
        one = one or f"the {engine.target.backend_name} backend keeps one sequence here"
        why = f"{one}: requests run one at a time"
    else:
        why = (
            "continuous batching over llama.cpp sequences: the open streams' tokens and n-gram drafts go "
            "in one decode per step; a stream that starts alone drafts with the engine's drafter, those "
            "that join it with their own n-gram lookup; a request with a seed (sampled) runs alone, in a "
            "cache emptied of other slots, and decodes plainly, so that its text does not depend on them"
        )
    return {
        "slots": len(engine.slots.slots),
        "batched": scheduler.batched,
        "reason": why,
        "batch_steps": scheduler.batch_steps,
    }
