"""The native backend: chosen only where it can run, exact against llama.cpp and the reference on a GPU, with
either set of GEMV kernels (gemv.cu's float ones, mmvq.cu's int8-activation ones)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.cli.bench import NEAR_TIE
from app.config import DraftSettings, EngineSettings, Settings
from app.engine.backends.native import gpu_available, native_support
from app.engine.engine import Engine
from app.engine.errors import DrafterUnusable, ModelLoadError
from tests.engine.kernels.test_mmvq import INT8_LOGIT_ERROR
from tests.support.helpers import assert_exact, run_checked

NO_GPU = gpu_available()


def _settings(
    backend: str,
    mode: str = "none",
    max_draft: int = 8,
    device: str = "auto",
    draft_backend: str = "auto",
    draft_device: str = "auto",
) -> Settings:
    engine = EngineSettings(
        n_ctx=2048,
        n_threads=2,
        backend=backend,  # type: ignore[arg-type]
        device=device,
        draft_backend=draft_backend,  # type: ignore[arg-type]
        draft_device=draft_device,
    )
    return Settings(engine=engine, draft=DraftSettings(mode=mode, max_draft=max_draft, adaptive=False))  # type: ignore[arg-type]


# --- the choice (any machine) ---------------------------------------------------------------------------


def test_auto_says_why_it_runs_llama_cpp(gemma_path: Path) -> None:
    with Engine(gemma_path, None, _settings("auto", device="cpu")) as engine:
        target = engine.props()["target"]
        assert target["backend"] == "llama"
        assert "CPU" in target["backend_reason"]


def test_native_on_a_cpu_setting_is_refused_with_the_reason(gemma_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"native backend cannot run .*CPU"):
        Engine(gemma_path, None, _settings("native", device="cpu"))


def test_native_is_refused_for_drafts_wider_than_its_passes_and_for_a_pinned_gpu(gemma_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="drafts of 32 tokens"):
        Engine(gemma_path, None, _settings("native", "ngram", max_draft=32))
    with pytest.raises(ModelLoadError, match="current GPU only"):
        Engine(gemma_path, None, _settings("native", device="gpu:1"))


def test_a_drafter_says_which_backend_runs_it_and_native_on_the_cpu_is_refused(gemma_path: Path) -> None:
    settings = _settings("llama", "model", device="cpu", draft_device="cpu")
    with Engine(gemma_path, gemma_path, settings) as engine:
        draft = engine.props()["draft"]
        assert draft["backend"] == "llama"
        assert "CPU" in draft["backend_reason"]
    settings = _settings("llama", "model", device="cpu", draft_backend="native", draft_device="cpu")
    with pytest.raises(DrafterUnusable, match=r"native backend cannot run .*CPU"):
        Engine(gemma_path, gemma_path, settings)


@pytest.mark.skipif(NO_GPU is None, reason="this machine has a GPU for CuPy")
def test_without_a_gpu_native_is_refused_and_auto_falls_back(gemma_path: Path) -> None:
    assert native_support(gemma_path) == NO_GPU
    with pytest.raises(ModelLoadError, match="native backend cannot run"):
        Engine(gemma_path, None, _settings("native"))
    with Engine(gemma_path, None, _settings("auto")) as engine:
        target = engine.props()["target"]
        assert target["backend"] == "llama"
        assert NO_GPU in target["backend_reason"]


# --- on a GPU -------------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))


@pytest.fixture(scope="module", params=["reference", "fast"])
def native_gemma(gemma_path: Path, request: pytest.FixtureRequest):
    if NO_GPU is not None:
        pytest.skip(NO_GPU)
    from app.engine.backends.native import NativeBackend

    with NativeBackend(gemma_path, n_ctx=2048, gemv=request.param) as backend:
        assert backend.gemv == request.param
        yield backend


def test_the_gemv_setting_defaults_to_the_reference_kernels(gemma_path: Path) -> None:
    from app.engine.backends.native import GEMV_KERNELS, NativeBackend

    with pytest.raises(ValueError, match="gemv 'int4': one of reference, fast"):
        NativeBackend(gemma_path, gemv="int4")
    assert EngineSettings().native_gemv == "reference"
    assert set(GEMV_KERNELS) == {"reference", "fast"}
    assert EngineSettings(native_gemv="fast").native_gemv == "fast"
    with pytest.raises(ValueError, match="native_gemv"):
        EngineSettings(native_gemv="int4")  # type: ignore[arg-type]


PROMPT = (
    b"<start_of_turn>user\nList five prime numbers and say why each is prime.<end_of_turn>\n"
    b"<start_of_turn>model\n"
)


@pytest.mark.gpu
@gpu
def test_native_logits_match_the_reference(native_gemma, gemma_path: Path) -> None:
    from app.engine.kernels.reference import ReferenceModel

    ref = ReferenceModel(gemma_path)
    tokens = native_gemma.tokenize(PROMPT, True, True)
    native_gemma.rollback(0)
    w = native_gemma.max_width  # logits come from the last pass of a decode: one pass per chunk
    got = np.concatenate([native_gemma.decode(tokens[i : i + w], 0).copy() for i in range(0, len(tokens), w)])
    want = ref.forward(tokens, ref.new_cache(len(tokens) + 1))
    spread = want.max(axis=1) - want.min(axis=1)
    err = np.abs(got - want).max(axis=1) / spread
    # The kernels keep K/V in f16 (the reference in f32) and sum in another order: 1% of the spread. Int8
    # activations move the logits further (test_mmvq.py measures how far on the reference itself).
    fast = native_gemma.gemv == "fast"
    assert err.max() < (INT8_LOGIT_ERROR if fast else 0.01), f"logit error {err.max():.4f} of the spread"
    agree = (got.argmax(axis=1) == want.argmax(axis=1)).mean()
    assert agree > (0.85 if fast else 0.95)
    print(
        f"\nnative ({native_gemma.gemv}) vs reference: max logit error {err.max():.5f} of the spread, "
        f"argmax agree {agree:.3f}"
    )


@pytest.mark.gpu
@gpu
def test_a_verify_pass_equals_steps_one_by_one(native_gemma) -> None:
    tokens = native_gemma.tokenize(PROMPT, True, True)
    native_gemma.rollback(0)
    native_gemma.decode_argmax(tokens[:-8], len(tokens) - 9)
    batch = native_gemma.decode(tokens[-8:], 0).copy()
    native_gemma.rollback(len(tokens) - 8)
    single = np.stack([native_gemma.decode([t], 0)[0].copy() for t in tokens[-8:]])
    # Either GEMV does the same operations in the same order for any batch: exact, not close.
    assert np.array_equal(batch.argmax(axis=1), single.argmax(axis=1))
    assert np.abs(batch - single).max() < 1e-3


@pytest.mark.gpu
@gpu
def test_the_protocol_of_one_sequence(native_gemma) -> None:
    """One KV sequence, no RPC devices, no prefix kept for reproducible requests, the tokenizer's vocabulary
    for grammars; `feed` leaves the cache as a decode of the same tokens does."""
    assert (native_gemma.n_seq, native_gemma.devices_key, native_gemma.aligned_prefix()) == (1, "", 0)
    assert native_gemma.llama_vocab is not None
    tokens = native_gemma.tokenize(PROMPT, True, True)[:8]  # one pass, below the tensor-core width
    native_gemma.rollback(0)
    native_gemma.feed(tokens[:-1])
    assert native_gemma.kv_tokens == tokens[:-1]
    fed = native_gemma.decode_argmax(tokens[-1:], 0)
    native_gemma.rollback(0)
    assert native_gemma.decode_argmax(tokens, len(tokens) - 1) == fed


@pytest.mark.gpu
@gpu
def test_native_greedy_equals_llama_cpp_for_256_tokens(native_gemma, gemma_path: Path) -> None:
    from app.engine.backends.llama import LlamaBackend, gpu_offload_supported

    if not gpu_offload_supported():
        pytest.skip("this llama.cpp build has no GPU backend")
    prompt = native_gemma.tokenize(PROMPT, True, True)

    def greedy(backend) -> list[int]:
        backend.rollback(0)
        out = backend.decode_argmax(prompt, len(prompt) - 1)
        while len(out) < 256:
            out += backend.decode_argmax([out[-1]], 0)
        return out

    native = greedy(native_gemma)
    with LlamaBackend(gemma_path, EngineSettings(n_ctx=2048, device="gpu")) as llama:
        ours = greedy(llama)
        diff = next((i for i, (a, b) in enumerate(zip(native, ours, strict=True)) if a != b), None)
        if diff is not None:
            llama.rollback(0)
            row = llama.decode(prompt + ours[:diff], len(prompt) + diff - 1)[0]
            top = np.sort(row)[-2:]
            margin = float(top[1] - top[0])
            assert margin < NEAR_TIE, f"native and llama.cpp part at token {diff}, margin {margin:.3f}"
    print(f"\nnative ({native_gemma.gemv}) vs llama.cpp greedy, 256 tokens: part at {diff}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("target_backend", "mode", "draft_backend"),
    [("native", "ngram", "auto"), ("native", "model", "llama"), ("native", "model", "native"),
     ("llama", "model", "native")],
    ids=["native-ngram", "native-llama_drafter", "native-native_drafter", "llama-native_drafter"],
)  # fmt: skip
def test_speculative_decoding_on_the_native_backend_is_exact(
    gemma_path: Path, target_backend: str, mode: str, draft_backend: str
) -> None:
    draft = gemma_path if mode == "model" else None
    settings = _settings(target_backend, mode, 8, "gpu", draft_backend, "gpu")
    with Engine(gemma_path, draft, settings) as engine:
        props = engine.props()
        assert props["target"]["backend"] == target_backend
        if mode == "ngram":
            prompt = engine.tokenize_text("def add(a, b):\n    return a + b\n\n" * 6)
        else:
            assert props["draft"]["backend"] == draft_backend
            prompt = engine.render_chat([{"role": "user", "content": "List five prime numbers."}]).tokens
        plain, _ = run_checked(engine, prompt, 96, speculative=False)
        spec, stats = run_checked(engine, prompt, 96, speculative=True)
        diff = assert_exact(engine, prompt, plain, spec)
        assert stats.accepted > 0
        label = f"{target_backend} target, {mode} drafts ({draft_backend})"
        print(f"\n{label}: acceptance {stats.acceptance_rate:.3f}, parted at {diff}")


@pytest.mark.gpu
@gpu
def test_auto_times_both_backends_once_and_keeps_the_faster(gemma_path: Path) -> None:
    settings = _settings("auto", "ngram", 8, "gpu")
    with Engine(gemma_path, None, settings) as engine:
        target = engine.props()["target"]
    choice = target["backend_choice"]
    assert choice is not None, target["backend_reason"]
    assert target["backend"] == choice["backend"]
    assert choice["native"]["width"] == choice["llama"]["width"] == 9
    assert min(choice["native"]["verify_ms"], choice["llama"]["verify_ms"]) > 0
    assert f"{choice['native_speedup']:.2f}x" in target["backend_reason"]
    print(f"\nauto on {gemma_path.name}: {target['backend']}; {target['backend_reason']}")
    with Engine(gemma_path, None, settings) as engine:  # the next load reads the timings back
        again = engine.props()["target"]
    assert again["backend_choice"]["cached"]
    assert again["backend"] == target["backend"]
