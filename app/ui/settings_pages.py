"""How the settings dialog groups app.config's fields for people: pages, plain names, what a field's
lowest value means, and when a change takes effect (at once, at an engine restart, at the next start)."""

from __future__ import annotations

from dataclasses import dataclass

from app.config import Settings

NOW, ENGINE_RESTART, NEXT_START, SERVE = "now", "engine", "start", "serve"
APPLIES = {
    NOW: "applies at once",
    ENGINE_RESTART: "applies when the engine restarts",
    NEXT_START: "applies when Foresight starts again",
    SERVE: "for `python -m app serve`",
}


@dataclass(frozen=True)
class Row:
    section: str
    name: str
    label: str
    lowest: str | None = None  # what the lowest value means, shown instead of the number

    @property
    def applies(self) -> str:
        """When a change takes effect: the window sends sampling with every question and sets its theme at
        once; the library is read at start; the engine reads the rest when it starts."""
        if (self.section == "sampling" and self.name != "repeat_last_n") or self.section == "appearance":
            return NOW
        if self.section == "models":
            return NEXT_START
        if self.section == "server" and self.name in ("host", "port"):
            return SERVE
        return ENGINE_RESTART


@dataclass(frozen=True)
class Page:
    title: str
    intro: str
    rows: tuple[Row, ...]


PAGES = (
    Page(
        "Model",
        "Where models are kept, how much of a conversation the model sees, and how it writes its answers.",
        (
            Row("models", "dir", "Models folder"),
            Row("models", "hf_cache", "Also list the Hugging Face cache"),
            Row("engine", "n_ctx", "Context length (tokens)", "automatic (as much as fits)"),
            Row("engine", "mmproj", "Vision projector (lets the model read images)"),
            Row("sampling", "temperature", "Temperature (0: always the likeliest word)"),
            Row("sampling", "max_tokens", "Longest answer (tokens)"),
            Row("sampling", "top_p", "Top p"),
            Row("sampling", "top_k", "Top k", "all"),
            Row("sampling", "min_p", "Min p"),
            Row("sampling", "repeat_penalty", "Repetition penalty"),
            Row("sampling", "seed", "Random seed"),
        ),
    ),
    Page(
        "Speed",
        "Speculative decoding: a drafter proposes words, the model checks them all in one pass. The answer "
        "is the same; only the speed changes.",
        (
            Row("draft", "mode", "Drafting"),
            Row("draft", "max_draft", "Longest draft (tokens)"),
            Row("draft", "adaptive", "Adapt the draft length to what pays"),
            Row("engine", "device", "Run the model on"),
            Row("engine", "draft_device", "Run the drafter on"),
            Row("engine", "n_threads", "CPU threads", "automatic (one per core)"),
        ),
    ),
    Page(
        "Privacy & network",
        "Foresight answers on this computer only. The local API server (View > Local API server) opens a "
        "port for editors and tools; other devices need its key.",
        (
            Row("server", "host", "Address to listen on"),
            Row("server", "port", "Port"),
            Row("server", "cors_origin", "Web page allowed to call the API (CORS origin)"),
        ),
    ),
    Page("Appearance", "How the window looks.", (Row("appearance", "theme", "Theme"),)),
)
ADVANCED = Page(
    "Advanced",
    "Engine details. The defaults suit most machines.",
    (
        Row("engine", "n_batch", "Prompt tokens per batch"),
        Row("engine", "slots", "Requests answered side by side", "one at a time"),
        Row("engine", "backend", "Model runner"),
        Row("engine", "draft_backend", "Drafter runner"),
        Row("engine", "gpu_layers", "Layers on the GPU", "all"),
        Row("engine", "tensor_split", "Share of the model per GPU (e.g. 3, 1)"),
        Row("engine", "rpc", "Remote devices (ggml-rpc workers, host:port, …)"),
        Row("engine", "device_argmax", "Pick the likeliest word on the GPU"),
        Row("engine", "flash_attn", "Flash attention"),
        Row("engine", "max_image_bytes", "Largest image (bytes)"),
        Row("engine", "max_image_pixels", "Most pixels per question"),
        Row("engine", "max_images", "Images per question"),
        Row("draft", "ngram_min", "Shortest n-gram looked up"),
        Row("draft", "ngram_max", "Longest n-gram looked up"),
        Row("sampling", "repeat_last_n", "Repetition window (tokens)"),
        Row("server", "queue_size", "Requests waiting at most"),
        Row("models", "catalog", "Pairs catalog file"),
    ),
)


def pages() -> tuple[Page, ...]:
    """Every page, Advanced last, which also takes any field no page names (a new one gets its own name
    until it is given a place)."""
    fields = {
        (section, name)
        for section, info in Settings.model_fields.items()
        for name in info.annotation.model_fields  # type: ignore[union-attr]
    }
    named = {(r.section, r.name) for p in (*PAGES, ADVANCED) for r in p.rows}
    rest = tuple(
        Row(section, name, name.replace("_", " ").capitalize())
        for section, info in Settings.model_fields.items()
        for name in info.annotation.model_fields  # type: ignore[union-attr]
        if (section, name) not in named
    )
    pages = (*PAGES, Page(ADVANCED.title, ADVANCED.intro, ADVANCED.rows + rest))
    # a row whose field this version of the settings does not have is left out
    return tuple(
        Page(p.title, p.intro, tuple(r for r in p.rows if (r.section, r.name) in fields)) for p in pages
    )
