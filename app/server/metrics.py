"""The engine's counters since start, as /metrics exports them in Prometheus' text format."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.stats import SpecStats


@dataclass
class Metrics:
    """Counters since start; written by the engine thread only, read by /metrics."""

    requests: int = 0
    failed: int = 0
    dropped: int = 0  # queued jobs whose client left before they started: never rendered nor prefilled
    prompt_tokens: int = 0
    tokens_generated: int = 0
    drafted: int = 0
    accepted: int = 0
    last_tokens_per_second: float = 0.0
    kv_tokens: int = 0  # tokens the last request's KV slot keeps for prefix reuse
    kv_cells: int = 0  # positions llama.cpp's cache holds for that slot; differs only if cells leaked
    kv_slots_tokens: int = 0  # the same over all KV slots (each client's prefixes)
    kv_slots_cells: int = 0

    def record(self, stats: SpecStats) -> None:
        self.prompt_tokens += stats.prompt_tokens
        self.tokens_generated += stats.emitted
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.last_tokens_per_second = stats.tokens_per_second

    def prometheus(self, queue_depth: int) -> str:
        rows = [
            ("requests_total", "counter", "generation requests run", self.requests),
            ("requests_failed_total", "counter", "generation requests that ended in an error", self.failed),
            (
                "jobs_dropped_total",
                "counter",
                "queued requests dropped unrun: their client left",
                self.dropped,
            ),
            ("prompt_tokens_total", "counter", "prompt tokens processed", self.prompt_tokens),
            ("tokens_generated_total", "counter", "tokens generated", self.tokens_generated),
            ("drafted_tokens_total", "counter", "draft tokens proposed for verification", self.drafted),
            ("accepted_tokens_total", "counter", "draft tokens the target accepted", self.accepted),
            (
                "last_tokens_per_second",
                "gauge",
                "decode speed of the last request",
                self.last_tokens_per_second,
            ),
            ("queue_depth", "gauge", "requests waiting for the engine", queue_depth),
            (
                "kv_tokens",
                "gauge",
                "tokens the last request's KV slot keeps for prefix reuse",
                self.kv_tokens,
            ),
            (
                "kv_cells",
                "gauge",
                "positions llama.cpp's cache holds for that slot (= kv_tokens)",
                self.kv_cells,
            ),
            ("kv_slots_tokens", "gauge", "tokens all KV slots keep for prefix reuse", self.kv_slots_tokens),
            (
                "kv_slots_cells",
                "gauge",
                "positions llama.cpp's cache holds (= kv_slots_tokens)",
                self.kv_slots_cells,
            ),
        ]
        lines = []
        for name, kind, text, value in rows:
            lines += [f"# HELP foresight_{name} {text}", f"# TYPE foresight_{name} {kind}"]
            lines.append(f"foresight_{name} {value}")
        return "\n".join(lines) + "\n"
