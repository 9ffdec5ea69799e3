"""Typed settings, defined once: defaults and bounds here; file (TOML) < environment < CLI flags."""

from __future__ import annotations

import argparse
import json
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app import paths
from app.addresses import parse_endpoints

ENV_PREFIX = "FORESIGHT_"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplingSettings(Section):
    """Default sampling for a request that does not say otherwise."""

    temperature: float = Field(0.7, ge=0.0, le=5.0, description="0 means greedy decoding")
    top_k: int = Field(40, ge=0, le=100_000, description="keep the k most likely tokens (0: all)")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="nucleus sampling mass")
    min_p: float = Field(0.05, ge=0.0, le=1.0, description="drop tokens below min_p x the top probability")
    repeat_penalty: float = Field(1.0, ge=0.0, le=5.0, description="1.0 disables the repetition penalty")
    repeat_last_n: int = Field(64, ge=0, le=8192, description="window of the repetition penalty")
    max_tokens: int = Field(1024, ge=1, le=1_048_576, description="tokens generated at most per request")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="random seed (unset: fresh per request)")


class DraftSettings(Section):
    """How tokens are drafted for speculative decoding."""

    mode: Literal["auto", "model", "ngram", "none"] = Field(
        "auto", description="auto: the drafter model if one is given, else n-gram prompt lookup"
    )
    max_draft: int = Field(16, ge=1, le=64, description="longest draft verified in one target pass")
    ngram_min: int = Field(2, ge=1, le=8, description="shortest n-gram matched in the prompt lookup")
    ngram_max: int = Field(
        6,
        ge=1,
        le=16,
        description="longest n-gram matched in the prompt lookup (the longer, the surer the source)",
    )
    adaptive: bool = Field(True, description="choose the draft length from measured acceptance and cost")


class EngineSettings(Section):
    """Model loading and placement."""

    n_ctx: int = Field(
        0,
        ge=0,
        le=1_048_576,
        description="context length in tokens (0: the largest the fit allows on the chosen devices, up to "
        "the model's trained length and 32k)",
    )
    n_batch: int = Field(512, ge=32, le=8192, description="prompt tokens evaluated per llama_decode call")
    slots: int = Field(
        8,
        ge=1,
        le=64,
        description="KV slots of a llama.cpp target: requests decoded side by side, each client keeping its "
        "own prefix (they share the n_ctx cells; 1: one request at a time)",
    )
    n_threads: int = Field(0, ge=0, le=512, description="CPU threads (0: physical cores)")
    device: str = Field(
        "auto", description="auto (where the fit says), cpu, gpu, or gpu:N (llama.cpp's GPU numbering)"
    )
    backend: Literal["auto", "llama", "native"] = Field(
        "auto",
        description="target runner: llama.cpp, or our own GPU kernels (auto: native where the GPU, "
        "architecture and weight types allow, else llama.cpp)",
    )
    draft_device: str = Field(
        "auto", description="device of the drafter model: auto (where the fit says), cpu, gpu or gpu:N"
    )
    draft_backend: Literal["auto", "llama", "native"] = Field(
        "auto",
        description="drafter model runner: llama.cpp, or our own GPU kernels (auto: native where the GPU, "
        "architecture and weight types allow, else llama.cpp)",
    )
    native_gemv: Literal["reference", "fast"] = Field(
        "reference",
        description="matrix-vector kernels of the native backend: reference (float activations) or fast "
        "(activations quantised to int8 per 32, as llama.cpp's CUDA build does; dp4a, each weight read once "
        "per pass)",
    )
    gpu_layers: int = Field(-1, ge=-1, le=1024, description="layers offloaded on a GPU device (-1: all)")
    tensor_split: list[float] | None = Field(
        None, description="share of the target per GPU, e.g. 3,1 (with rpc: the workers' devices first)"
    )
    rpc: str = Field(
        "",
        description="remote devices: ggml-rpc workers as host:port, comma-separated (`python -m app "
        "rpc-worker` on each); the link is neither encrypted nor authenticated: loopback or an SSH tunnel",
    )
    device_argmax: bool = Field(
        True, description="greedy decoding takes the argmax on the device instead of copying logits out"
    )
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto", description="llama.cpp flash attention (auto: where the device supports it)"
    )
    mmproj: str | None = Field(
        None, description="vision projector GGUF (mmproj) of the target: lets it read images"
    )
    max_image_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, description="largest image file taken, in bytes"
    )
    max_image_pixels: int = Field(
        16_000_000,
        ge=1,
        le=1_000_000_000,
        description="most pixels per request, all its images together (read from headers before decoding)",
    )
    max_images: int = Field(4, ge=1, le=64, description="images taken per request at most")

    @field_validator("n_ctx")
    @classmethod
    def _context_or_auto(cls, value: int) -> int:
        if 0 < value < 256:
            raise ValueError("0 (sized by the fit) or at least 256 tokens")
        return value

    @field_validator("rpc")
    @classmethod
    def _workers(cls, value: str) -> str:
        return ",".join(str(e) for e in parse_endpoints(value))  # ValueError names a malformed one


class ServerSettings(Section):
    """The engine's HTTP listener (`python -m app serve`)."""

    host: str = Field("127.0.0.1", description="address to listen on (not loopback: needs FORESIGHT_API_KEY)")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0: the OS picks a free one)")
    queue_size: int = Field(
        64, ge=1, le=1024, description="requests waiting for the engine before 503 server_busy"
    )
    per_client: int = Field(
        8, ge=1, le=1024, description="requests one client may have running or waiting before 429"
    )
    cors_origin: str | None = Field(None, description="browser origin allowed by CORS (unset: CORS off)")


class ModelsSettings(Section):
    """The model library (`python -m app models ...`)."""

    dir: str | None = Field(None, description="models folder (unset: 'models' in the platform data dir)")
    hf_cache: bool = Field(True, description="list GGUF files of the Hugging Face cache in the library")
    catalog: str | None = Field(None, description="a pairs catalog file to use instead of the built-in one")

    def folder(self) -> Path:
        if self.dir:
            path = Path(self.dir).expanduser()
            path.mkdir(parents=True, exist_ok=True)
            return path
        return paths.models_dir()


class AppearanceSettings(Section):
    """How the desktop window looks."""

    theme: Literal["system", "light", "dark"] = Field(
        "system", description="the window's colours: the system's, or always light, or always dark"
    )


class Settings(Section):
    engine: EngineSettings = Field(default_factory=EngineSettings)
    draft: DraftSettings = Field(default_factory=DraftSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    appearance: AppearanceSettings = Field(default_factory=AppearanceSettings)


class ConfigError(ValueError):
    """A settings file, variable or flag holds a value outside its bounds."""


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _from_env(environ: typing.Mapping[str, str]) -> dict[str, Any]:
    """FORESIGHT_ENGINE__N_CTX=8192 -> {"engine": {"n_ctx": "8192"}} (pydantic converts the string)."""
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, field = name[len(ENV_PREFIX) :].lower().partition("__")
        if section in Settings.model_fields:
            out.setdefault(section, {})[field] = value.split(",") if field == "tensor_split" else value
    return out


def load_settings(
    file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: typing.Mapping[str, str] | None = None,
) -> Settings:
    """Settings from the TOML file, then FORESIGHT_SECTION__FIELD variables, then explicit overrides."""
    file = file if file is not None else paths.config_file()
    layered: dict[str, Any] = {}
    if file.exists():
        try:
            layered = tomllib.loads(file.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    layered = _merge(layered, _from_env(os.environ if environ is None else environ))
    layered = _merge(layered, overrides or {})
    try:
        return Settings.model_validate(layered)
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc


def save_settings(settings: Settings, file: Path | None = None) -> Path:
    """Write the values that differ from the defaults to the TOML file, atomically; returns the file.

    Defaults stay in this module only, so a later release's better default reaches users who never
    changed the value. The file is replaced whole: comments in a hand-edited file are not kept.
    """
    file = file if file is not None else paths.config_file()
    lines: list[str] = []
    for section, fields in settings.model_dump(exclude_defaults=True).items():
        lines.append(f"[{section}]")
        for name, value in fields.items():
            if value is None:  # TOML has no null; every field that may be None defaults to None
                raise ConfigError(f"{section}.{name}: cannot write None over a default of another value")
            lines.append(f"{name} = {_toml_value(value)}")
        lines.append("")
    file.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(file, "\n".join(lines))
    return file


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # a JSON string is a TOML basic string, once DEL (raw in JSON, escaped in TOML) is escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {type(value).__name__} to TOML")


def _arg_type(annotation: Any) -> tuple[Any, dict[str, Any]]:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _arg_type(args[0])
    if origin is Literal:
        return str, {"choices": list(typing.get_args(annotation))}
    if origin is list:
        return (lambda text: [float(x) for x in text.split(",")]), {}
    if annotation is bool:
        return None, {"action": argparse.BooleanOptionalAction}
    return annotation, {}


def add_section_flags(parser: argparse.ArgumentParser, section: str, only: typing.Iterable[str]) -> None:
    """Add `--field-name` flags for the chosen fields of one settings section, help and choices included.

    Flags default to None so that only values the user typed override the file and environment.
    """
    model = Settings.model_fields[section].annotation
    assert isinstance(model, type)
    assert issubclass(model, Section)
    for name in only:
        info = model.model_fields[name]
        kind, extra = _arg_type(info.annotation)
        flag = "--" + name.replace("_", "-")
        if kind is not None:
            extra["type"] = kind
        parser.add_argument(
            flag,
            dest=f"{section}__{name}",
            default=None,
            help=f"{info.description} (default: {info.default})",
            **extra,
        )


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in vars(args).items():
        if "__" in key and value is not None:
            section, _, field = key.partition("__")
            out.setdefault(section, {})[field] = value
    return out
