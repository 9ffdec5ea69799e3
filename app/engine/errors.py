"""Engine exceptions: each has a stable code that the API layer maps to OpenAI's error shape."""

from __future__ import annotations


class EngineError(Exception):
    code = "engine_error"


class ModelLoadError(EngineError):
    """The model file is missing, is not GGUF, is truncated, or llama.cpp refused it."""

    code = "model_load_failed"


class DrafterUnusable(ModelLoadError):
    """The drafter cannot draft at all (not a text model, unreadable); a vocabulary mismatch is not this."""

    code = "drafter_unusable"


class InvalidRequest(EngineError):
    code = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class DecodeError(EngineError):
    """llama_decode failed (out of KV slots, backend error)."""

    code = "decode_failed"
