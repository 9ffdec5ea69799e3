"""Images through libmtmd: a real engine server with a tiny random-weight projector built for the test model.

The tiny projector (tests/support/mmproj.py) is random, so its answers are noise; what it checks is the
plumbing: libmtmd's token count, determinism, that the image reaches the model, the errors, and the KV
bookkeeping. A second projector is built (not trained) to carry a solid colour to the colour's word:
with it Qwen2.5-Coder-1.5B names the colour of the image.
"""

from __future__ import annotations

# llama_cpp before NumPy: with a CUDA build the other order was seen to segfault.
import llama_cpp  # noqa: F401  # isort: skip

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from app.config import Settings
from app.engine.engine import Engine
from app.engine.errors import ModelLoadError
from app.engine.generation import GenerationRequest
from app.engine.sampling import SamplingParams
from app.engine.vision import IMAGE_POSITION, ImageError, ImageLimits, read_image_part
from tests.support.mmproj import (
    TOKENS_PER_IMAGE,
    jpeg_header_only,
    png,
    png_header_only,
    write_colour_mmproj,
    write_tiny_mmproj,
)
from tests.support.server_helpers import EngineServer, engine_server

GEMMA_EMBD, QWEN_EMBD = 640, 1536
# At the default 0.02 the image embeddings are too faint for gemma-3-270m to answer differently; at 5
# the three test images below give three different answers (seed 0).
PROJECTION_SCALE = 5.0
TOKEN = "admin-token-vision-0123456789"
MAX_IMAGE_BYTES = 64 * 1024
ARGS = ["--ngram", "--n-ctx", "1024", "--n-threads", "2", "--token-stdin"]
CHAT = "/v1/chat/completions"
GRADIENT, RED, BLUE = png(32, 32), png(32, 32, (255, 0, 0)), png(32, 32, (0, 0, 255))


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(data)}}


def question(*images: bytes, text: str = "Describe this image.") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*(image(i) for i in images), {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def gemma_mmproj(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mmproj") / "tiny-gemma3-mmproj-640.gguf"
    return write_tiny_mmproj(out, GEMMA_EMBD, projection_scale=PROJECTION_SCALE)


@pytest.fixture(scope="module")
def server(gemma_path: Path, gemma_mmproj: Path) -> Iterator[EngineServer]:
    args = ["--target", str(gemma_path), "--mmproj", str(gemma_mmproj), *ARGS]
    env = {"FORESIGHT_ENGINE__MAX_IMAGE_BYTES": str(MAX_IMAGE_BYTES)}
    with engine_server(args, env=env, stdin=TOKEN + "\n") as s:
        yield s


@pytest.fixture(scope="module")
def http(server: EngineServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=180) as c:
        yield c


def ask(http: httpx.Client, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    response = http.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    return response.json()


# --- through the API --------------------------------------------------------------------------------
def test_props_say_the_model_sees(http: httpx.Client, gemma_mmproj: Path) -> None:
    props = http.get("/props").json()
    assert props["vision"] is True
    assert props["projector"]["path"] == str(gemma_mmproj)
    assert props["projector"]["image_draft_mode"] == "ngram"


def test_an_image_goes_in_with_libmtmds_token_count(server: EngineServer) -> None:
    client = OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0, timeout=180)
    out = client.chat.completions.create(
        model="any", messages=question(GRADIENT), max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    assert out.usage is not None
    details = out.usage.prompt_tokens_details
    assert details is not None
    assert details.image_tokens == TOKENS_PER_IMAGE  # a field of OpenAI's own usage type
    speculative = out.usage.model_extra["speculative"]
    assert speculative["images"] == 1
    assert speculative["image_tokens"] == TOKENS_PER_IMAGE
    # the n-gram lookup still drafts for an image prompt (it looks in the text, never at the image)
    assert speculative["image_mode"] == "ngram"
    assert speculative["draft_source"] == "ngram"
    text_only = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Describe this image."}], max_tokens=1
    )
    assert text_only.usage is not None
    # gemma3's projector frames each image with <start_of_image> ... <end_of_image> and blank lines
    assert out.usage.prompt_tokens > text_only.usage.prompt_tokens + TOKENS_PER_IMAGE


def test_same_image_same_answer_different_images_different_answers(http: httpx.Client) -> None:
    answers = {}
    for name, data in (("gradient", GRADIENT), ("red", RED), ("gradient again", GRADIENT), ("blue", BLUE)):
        answers[name] = ask(http, question(data))["choices"][0]["message"]["content"]
    assert answers["gradient"] == answers["gradient again"]
    assert len({answers["gradient"], answers["red"], answers["blue"]}) == 3, answers


def test_an_image_prompt_is_evaluated_anew_and_equals_plain_decoding(http: httpx.Client) -> None:
    first = ask(http, question(RED), max_tokens=16)
    again = ask(http, question(RED), max_tokens=16, speculative=False)
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    usage = again["usage"]
    # only the text before the image is reused; the image and all after it are evaluated again
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"] - TOKENS_PER_IMAGE
    assert usage["speculative"]["image_mode"] == "plain"
    assert usage["speculative"]["draft_source"] == "none"


def test_a_later_text_turn_never_reuses_across_the_image(http: httpx.Client) -> None:
    with_image = ask(http, question(BLUE))
    reply = with_image["choices"][0]["message"]["content"]
    text = "Describe this image."
    follow_up = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And again?"},
    ]
    later = ask(http, follow_up)
    cached = later["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached < with_image["usage"]["prompt_tokens"] - TOKENS_PER_IMAGE
    assert later["usage"]["speculative"]["images"] == 0
    assert later["usage"]["speculative"]["image_mode"] == ""
    # the same turn on a cache that never held an image answers the same
    ask(http, [{"role": "user", "content": "Something else entirely."}])
    assert ask(http, follow_up)["choices"][0]["message"] == later["choices"][0]["message"]


def test_streamed_image_answer_reports_image_tokens(http: httpx.Client) -> None:
    body = {
        "messages": question(GRADIENT),
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = None
    with http.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None
    assert usage["prompt_tokens_details"]["image_tokens"] == TOKENS_PER_IMAGE


WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(24)
BAD_IMAGES = {
    "not an image": (b"hello, not an image", "not an image"),
    "truncated PNG": (GRADIENT[:80], "cannot be decoded"),
    "WebP": (WEBP, "WebP"),
    "PNG bomb": (png_header_only(100_000, 100_000), "100000x100000 pixels"),
    "JPEG bomb": (jpeg_header_only(65_000, 65_000), "65000x65000 pixels"),
    "too large": (png(8, 8) + os.urandom(MAX_IMAGE_BYTES), f"limit of {MAX_IMAGE_BYTES} bytes"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_a_bad_image_is_refused_by_name_and_the_server_keeps_serving(http: httpx.Client, case: str) -> None:
    data, words = BAD_IMAGES[case]
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image(data)]}]
    response = http.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request_error")
    assert error["param"] == "messages[0].content[1]"
    assert words in error["message"]
    assert ask(http, question(RED), max_tokens=2)["usage"]["prompt_tokens_details"]["image_tokens"] == 4


@pytest.mark.parametrize(
    ("part", "words"),
    [
        ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "not fetched"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "not valid base64"),
        ({"type": "image_url", "image_url": {}}, "needs image_url.url"),
        ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, "data: URI"),
    ],
)
def test_urls_other_than_data_uris_are_refused(http: httpx.Client, part: dict[str, Any], words: str) -> None:
    messages = [{"role": "user", "content": [part]}]
    response = http.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages[0].content[0]"
    assert words in response.json()["error"]["message"]


def test_too_many_images_and_a_marker_in_the_text_are_refused(http: httpx.Client) -> None:
    five = question(RED, RED, RED, RED, RED)
    response = http.post(CHAT, json={"messages": five, "max_tokens": 2})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content[4]"
    assert "at most 4 images" in response.json()["error"]["message"]
    sneaky = question(RED, text="and <__media__> here")
    response = http.post(CHAT, json={"messages": sneaky, "max_tokens": 2})
    assert response.status_code == 400
    assert "image marker" in response.json()["error"]["message"]
    two = ask(http, question(RED, BLUE), max_tokens=2)
    assert two["usage"]["prompt_tokens_details"]["image_tokens"] == 2 * TOKENS_PER_IMAGE


def test_a_pair_loaded_without_projector_has_no_vision(
    http: httpx.Client, gemma_path: Path, gemma_mmproj: Path
) -> None:
    def load(body: dict[str, Any]) -> list[Any]:
        with http.stream("POST", "/admin/load", json=body) as stream:
            return [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]

    events = load({"target": str(gemma_path), "ngram": True})
    assert events[-1]["stage"] == "ready"
    assert events[-1]["vision"] is False
    assert http.get("/props").json()["vision"] is False
    response = http.post(CHAT, json={"messages": question(RED), "max_tokens": 2})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "model_has_no_vision"
    assert response.json()["error"]["param"] == "messages[0].content[0]"

    events = load({"target": str(gemma_path), "ngram": True, "mmproj": str(gemma_mmproj)})
    assert [e["stage"] for e in events][-3:] == ["loading projector", "calibrating", "ready"]
    assert events[-1]["vision"] is True
    assert ask(http, question(RED), max_tokens=2)["usage"]["prompt_tokens_details"]["image_tokens"] == 4


# --- in process: drafter models, other templates, projector mismatches ------------------------------
def settings(mmproj: Path, mode: str = "model") -> Settings:
    engine = {"n_ctx": 512, "n_threads": 2, "mmproj": str(mmproj)}
    return Settings.model_validate({"engine": engine, "draft": {"mode": mode}})


def run(engine: Engine, messages: list[dict[str, Any]], max_tokens: int = 6) -> tuple[str, Any]:
    prompt = engine.render_chat(messages)
    try:
        params = SamplingParams(temperature=0)
        request = GenerationRequest(
            prompt=prompt.tokens,
            params=params,
            max_tokens=max_tokens,
            draft_prompt=prompt.draft_prompt,
            media=prompt.media,
        )
        chunks = list(engine.generate(request))
    finally:
        prompt.close()
    return "".join(c.text for c in chunks), chunks[-1].stats


def test_a_drafter_model_sits_out_image_prompts_and_drafts_again_after(
    gemma_path: Path, gemma_mmproj: Path
) -> None:
    with Engine(gemma_path, gemma_path, settings(gemma_mmproj)) as engine:
        assert engine.props()["projector"]["image_draft_mode"] == "plain"
        _, stats = run(engine, question(GRADIENT))
        assert (stats.draft_source, stats.image_mode, stats.drafted) == ("none", "plain", 0)
        assert engine.target.kv_tokens.count(IMAGE_POSITION) == TOKENS_PER_IMAGE
        _, stats = run(engine, [{"role": "user", "content": "Count to ten: 1, 2, 3,"}])
        assert stats.draft_source == "model"
        assert stats.image_mode == ""
        assert IMAGE_POSITION not in engine.target.kv_tokens


def test_qwens_template_takes_the_marker_as_text(qwen_path: Path, tmp_path: Path) -> None:
    mmproj = write_tiny_mmproj(
        tmp_path / "tiny-mmproj-1536.gguf", QWEN_EMBD, projection_scale=PROJECTION_SCALE
    )
    with Engine(qwen_path, None, settings(mmproj, "none")) as engine:
        prompt = engine.render_chat(question(RED))
        try:
            assert prompt.text.count("<__media__>") == 1
            assert "<|im_start|>user\n<__media__>Describe this image.<|im_end|>" in prompt.text
            assert prompt.media is not None
            assert prompt.tokens.count(IMAGE_POSITION) == TOKENS_PER_IMAGE
        finally:
            prompt.close()
        _, stats = run(engine, question(RED), max_tokens=2)
        assert stats.image_tokens == TOKENS_PER_IMAGE


def test_a_projector_for_another_width_is_refused_at_load(gemma_path: Path, tmp_path: Path) -> None:
    wrong = write_tiny_mmproj(tmp_path / "tiny-mmproj-1536.gguf", QWEN_EMBD)
    with pytest.raises(ModelLoadError, match="not a vision projector for"):
        Engine(gemma_path, None, settings(wrong, "none"))
    with pytest.raises(ModelLoadError, match="no such projector"):
        Engine(gemma_path, None, settings(tmp_path / "missing.gguf", "none"))


# --- header checks, without a model -----------------------------------------------------------------
LIMITS = ImageLimits(max_bytes=1 << 20, max_pixels=4_000_000, max_images=4)


@pytest.mark.parametrize(
    ("data", "kind", "size"),
    [
        (png(31, 17), "png", (31, 17)),
        (jpeg_header_only(640, 480), "jpeg", (640, 480)),
        (b"GIF89a" + bytes((3, 0, 2, 0)) + bytes(10), "gif", (3, 2)),
    ],
)
def test_headers_give_format_and_size(data: bytes, kind: str, size: tuple[int, int]) -> None:
    part = read_image_part({"type": "image_url", "image_url": {"url": data_uri(data)}}, "p", LIMITS)
    assert (part.kind, (part.width, part.height)) == (kind, size)


def test_a_header_over_the_pixel_limit_is_refused_before_decoding() -> None:
    with pytest.raises(ImageError, match="2001x2000 pixels") as caught:
        read_image_part(
            {"type": "input_image", "image_url": data_uri(png_header_only(2001, 2000))}, "p", LIMITS
        )
    assert caught.value.param == "p"


COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def test_a_built_projector_lets_the_model_name_the_colour(qwen_path: Path, tmp_path: Path) -> None:
    """Not trained but built (tests/mmproj.write_colour_mmproj): a solid-colour image reaches
    Qwen2.5-Coder-1.5B as its own embedding of the colour's name, and it answers the question."""
    projector = write_colour_mmproj(tmp_path / "colour-mmproj.gguf", qwen_path, COLOURS)
    args = ["--target", str(qwen_path), "--mmproj", str(projector), "--no-draft", "--n-ctx", "1024"]
    with engine_server(args) as s, httpx.Client(base_url=s.url, timeout=180) as client:
        for name, rgb in COLOURS.items():
            for size in ((32, 32), (80, 48)):  # any size: the projector sees a 56x56 resize
                picture = question(png(*size, rgb), text="What colour is this image? Answer with one word.")
                answer = ask(client, picture)["choices"][0]["message"]["content"]
                assert answer.strip().strip(".").lower() == name, (name, size, answer)


def test_the_pixels_of_all_images_together_are_limited(http: httpx.Client) -> None:
    big = png(3000, 3000, (10, 20, 30))  # 9 M pixels: one is taken, two are over 16 M together
    assert ask(http, question(big), max_tokens=1)["usage"]["prompt_tokens_details"]["image_tokens"] == 4
    response = http.post(CHAT, json={"messages": question(big, big), "max_tokens": 1})
    assert response.status_code == 400, response.text
    assert "pixels together" in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == "messages[0].content[1]"
    assert ask(http, question(RED), max_tokens=1)["usage"]["prompt_tokens_details"]["image_tokens"] == 4
