"""EngineLaunch: the engine's command line read into app.config's types and written back."""

from __future__ import annotations

import pytest

from app.config import ConfigError, Settings
from app.services.engine import EngineLaunch

GUI_ARGV = [
    "--target",
    "t.gguf",
    "--ngram",
    "--temperature",
    "0",
    "--n-ctx=2048",
    "--device",
    "gpu",
    "--device",
    "cpu",  # given twice: the last one wins, as argparse has it
    "--no-device-argmax",
    "--tensor-split",
    "3,1",
    "--max-draft",
    "2",
    "--top-k",
    "5",
]


def test_the_command_line_is_read_into_typed_fields_and_written_back() -> None:
    launch = EngineLaunch.from_argv(GUI_ARGV)
    assert launch.target == "t.gguf"
    assert launch.draft_model is None
    assert launch.engine == {
        "n_ctx": 2048,
        "device": "cpu",
        "tensor_split": [3.0, 1.0],
        "device_argmax": False,
    }
    assert launch.draft == {"max_draft": 2, "mode": "ngram"}
    assert launch.extra == ("--temperature", "0", "--top-k", "5")  # not the launch's: passed on in order
    argv = launch.argv()
    assert argv[:3] == ["--target", "t.gguf", "--ngram"]
    assert argv[-4:] == ["--temperature", "0", "--top-k", "5"]
    assert argv.count("--device") == 1
    assert "--no-device-argmax" in argv
    assert argv[argv.index("--tensor-split") + 1] == "3.0,1.0"
    assert EngineLaunch.from_argv(argv) == launch
    assert EngineLaunch.from_argv([]).argv() == []  # nothing given: the engine's defaults


@pytest.mark.parametrize(
    ("argv", "mode", "flag"),
    [
        (["--draft", "d.gguf"], "model", "--draft"),
        (["--ngram"], "ngram", "--ngram"),
        (["--no-draft"], "none", "--no-draft"),
    ],
)
def test_each_draft_source_has_its_flag(argv: list[str], mode: str, flag: str) -> None:
    launch = EngineLaunch.from_argv(argv)
    assert launch.draft["mode"] == mode
    assert launch.argv()[0] == flag
    assert EngineLaunch.from_argv(launch.argv()) == launch


def test_a_pair_a_device_and_a_target_replace_what_they_name() -> None:
    launch = EngineLaunch.from_argv(["--draft", "d.gguf", "--mmproj", "old-mmproj.gguf", *GUI_ARGV[3:]])
    with_model = launch.with_pair("t2.gguf", "d2.gguf", False, None)
    assert (with_model.target, with_model.draft_model, with_model.draft["mode"]) == (
        "t2.gguf",
        "d2.gguf",
        "model",
    )
    assert "mmproj" not in with_model.engine  # the new pair has no projector
    argv = with_model.argv()
    assert argv[:4] == ["--target", "t2.gguf", "--draft", "d2.gguf"]
    assert "--mmproj" not in argv
    assert "--ngram" not in argv
    assert argv[-4:] == ["--temperature", "0", "--top-k", "5"]

    ngram = with_model.with_pair("t3.gguf", None, True, "p.gguf")
    assert (ngram.draft_model, ngram.draft["mode"], ngram.engine["mmproj"]) == (None, "ngram", "p.gguf")
    assert ngram.draft["max_draft"] == 2  # the other drafting fields stay
    plain = ngram.with_pair("t3.gguf", None, False, None)
    assert plain.draft["mode"] == "none"
    assert plain.argv()[2] == "--no-draft"

    gpu = plain.with_engine(device="gpu:1")
    assert gpu.engine["device"] == "gpu:1"
    assert plain.engine["device"] == "cpu"  # a launch is a value: the old one is unchanged
    assert EngineLaunch().with_target("m.gguf").argv() == ["--target", "m.gguf"]


def test_the_settings_the_engine_runs_with_are_the_file_s_under_the_launch() -> None:
    base = Settings()
    base.engine.n_batch = 128
    base.engine.n_ctx = 8192
    runs = EngineLaunch.from_argv(GUI_ARGV).settings(base)
    assert (runs.engine.n_ctx, runs.engine.n_batch, runs.engine.device) == (2048, 128, "cpu")
    assert (runs.draft.mode, runs.draft.max_draft) == ("ngram", 2)
    assert base.engine.n_ctx == 8192  # the base is left as it was


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EngineLaunch.from_argv(["--n-ctx", "many"]), "invalid int value"),
        (lambda: EngineLaunch.from_argv(["--n-ctx", "10"]), "n_ctx"),
        (lambda: EngineLaunch.from_argv(["--backend", "cuda"]), "invalid choice"),
        (lambda: EngineLaunch(engine={"no_such_field": 1}), "no_such_field"),
        (lambda: EngineLaunch(draft={"mode": "model"}), "drafter model"),
        (lambda: EngineLaunch(draft_model="d.gguf", draft={"mode": "ngram"}), "drafter model"),
        (lambda: EngineLaunch().with_engine(gpu_layers=-5), "gpu_layers"),
    ],
)
def test_what_the_engine_would_refuse_is_refused_here(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=message):
        make()
